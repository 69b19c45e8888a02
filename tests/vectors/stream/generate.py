"""Generate the normative HTTP telemetry stream vectors (tests/vectors/stream/*.json).

Every byte is laid out here by hand (struct), not by the encoder, so a vector
shows the layout of docs/PROTOCOL.md ("HTTP telemetry stream") directly. Frame
payloads are opaque to the stream: they are fixed byte strings (a version-1
and a version-2 header, a single byte), never produced by `wire.py`, so the
frame protocol's version does not change these vectors.

Each vector: `hex` (the stream's bytes), `finish` (whether the connection
closes after them), `items` (what a decoder returns, in order, also when an
error follows) and `error` (the exact message, or null). Decoders must give
the same result however the bytes are split into pushes.

    python tests/vectors/stream/generate.py          # rewrite the JSON file
    python tests/vectors/stream/generate.py --check  # exit 1 if it differs
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "telemetry_stream.json"
RUN_ID = bytes.fromhex("9c1f5e2a7b3d4c60a1e2f3041526a7b8")
BUFFER_BYTES = 4 << 20
HEARTBEAT_MS = 2000

# Opaque frame payloads: the stream carries them unchanged.
FRAME_V1 = bytes.fromhex(
    "5048554501010000" + RUN_ID.hex() + "8877665544332211" + "00" * 8 + "07" + "00" * 7
) + bytes(16)
FRAME_V2 = b"PHUE\x02\x02\x00\x00" + RUN_ID + bytes(40) + b"\x01\x02\x03"
FRAME_TINY = b"\x00"

Vector = dict[str, Any]


def preamble(
    magic: bytes = b"PHTS",
    version: int = 1,
    flags: int = 0,
    reserved: int = 0,
    run_id: bytes = RUN_ID,
    buffer_bytes: int = BUFFER_BYTES,
    heartbeat_ms: int = HEARTBEAT_MS,
) -> bytes:
    return struct.pack(
        "<4sBBH16sII", magic, version, flags, reserved, run_id, buffer_bytes, heartbeat_ms
    )


def item(kind: int, payload: bytes, length: int | None = None) -> bytes:
    return struct.pack("<BI", kind, len(payload) if length is None else length) + payload


def frame(payload: bytes) -> bytes:
    return item(1, payload)


def dropped(frames: int) -> bytes:
    return item(2, struct.pack("<I", frames))


def heartbeat() -> bytes:
    return item(3, b"")


def end(code: int, message: bytes) -> bytes:
    return item(4, struct.pack("<H", code) + message)


PRE = {
    "kind": "preamble",
    "run_id": RUN_ID.hex(),
    "buffer_bytes": BUFFER_BYTES,
    "heartbeat_ms": HEARTBEAT_MS,
}


def f(payload: bytes) -> dict[str, Any]:
    return {"kind": "frame", "hex": payload.hex()}


HB = {"kind": "heartbeat"}


def vector(
    name: str, data: bytes, items: list[dict[str, Any]], error: str | None, finish: bool = True
) -> Vector:
    return {"name": name, "hex": data.hex(), "finish": finish, "items": items, "error": error}


# A table on purpose: one entry per vector, each read on its own (long by design).
def all_vectors() -> list[Vector]:
    p = preamble()
    after = len(p)  # stream offset of the first item
    return [
        # ---------------------------------------------------------------- valid
        vector(
            "a whole stream: frames, a heartbeat, a drop notice and the end",
            p
            + frame(FRAME_V1)
            + heartbeat()
            + dropped(3)
            + frame(FRAME_TINY)
            + end(1, b"the server's telemetry hub is shutting down"),
            [
                PRE,
                f(FRAME_V1),
                HB,
                {"kind": "dropped", "frames": 3},
                f(FRAME_TINY),
                {
                    "kind": "end",
                    "code": 1,
                    "message": "the server's telemetry hub is shutting down",
                },
            ],
            None,
        ),
        vector("the preamble alone, connection still open", p, [PRE], None, finish=False),
        vector(
            "frames of any protocol version pass unchanged",
            p + frame(FRAME_V2) + end(3, b""),
            [PRE, f(FRAME_V2), {"kind": "end", "code": 3, "message": ""}],
            None,
        ),
        vector(
            "a multi-byte end message",
            p + end(2, "ré🙂".encode()),
            [PRE, {"kind": "end", "code": 2, "message": "ré🙂"}],
            None,
        ),
        vector(
            "the largest drop count and an unknown end code",
            p + dropped(0xFFFFFFFF) + end(999, b"x" * 1024),
            [
                PRE,
                {"kind": "dropped", "frames": 4294967295},
                {"kind": "end", "code": 999, "message": "x" * 1024},
            ],
            None,
        ),
        vector(
            "a stream still open in the middle of a frame item",
            p + frame(FRAME_V1)[:20],
            [PRE],
            None,
            finish=False,
        ),
        # ---------------------------------------------------------------- preamble errors
        vector(
            "bad magic, found from the first 4 bytes",
            b"HTTP",
            [],
            "telemetry stream: bad magic: expected 50485453, got 48545450",
            finish=False,
        ),
        vector(
            "bad magic (a frame sent without the stream framing)",
            FRAME_V1,
            [],
            "telemetry stream: bad magic: expected 50485453, got 50485545",
        ),
        vector(
            "unsupported stream version",
            preamble(version=2) + heartbeat(),
            [],
            "telemetry stream: unsupported stream version 2 (this build speaks 1)",
        ),
        vector(
            "reserved preamble flags",
            preamble(flags=1),
            [],
            "telemetry stream: reserved preamble field set: flags 1, reserved 0",
        ),
        vector(
            "reserved preamble field",
            preamble(reserved=0x0100),
            [],
            "telemetry stream: reserved preamble field set: flags 0, reserved 256",
        ),
        vector("empty stream", b"", [], "telemetry stream: truncated preamble: 0 of 32 bytes"),
        vector(
            "truncated preamble", p[:31], [], "telemetry stream: truncated preamble: 31 of 32 bytes"
        ),
        # ---------------------------------------------------------------- item errors
        vector(
            "unknown item type, after the items before it",
            p + frame(FRAME_TINY) + item(9, b"abc"),
            [PRE, f(FRAME_TINY)],
            f"telemetry stream: unknown item type 9 at byte {after + 6}",
        ),
        vector(
            "item type 0 is not an item",
            p + item(0, b""),
            [PRE],
            f"telemetry stream: unknown item type 0 at byte {after}",
        ),
        vector(
            "oversized frame item, refused from its header alone",
            p + struct.pack("<BI", 1, 65537),
            [PRE],
            f"telemetry stream: oversized frame item at byte {after}: 65537 bytes, limit 65536",
            finish=False,
        ),
        vector(
            "a length of 4 GiB is refused before anything is buffered",
            p + struct.pack("<BI", 1, 0xFFFFFFFF),
            [PRE],
            f"telemetry stream: oversized frame item at byte {after}: 4294967295 bytes, "
            "limit 65536",
            finish=False,
        ),
        vector(
            "empty frame item",
            p + item(1, b""),
            [PRE],
            f"telemetry stream: short frame item at byte {after}: 0 bytes, needs 1",
        ),
        vector(
            "dropped item too long",
            p + item(2, b"\x01\x00\x00\x00\x00"),
            [PRE],
            f"telemetry stream: oversized dropped item at byte {after}: 5 bytes, limit 4",
        ),
        vector(
            "dropped item too short",
            p + item(2, b"\x01\x00\x00"),
            [PRE],
            f"telemetry stream: short dropped item at byte {after}: 3 bytes, needs 4",
        ),
        vector(
            "heartbeat with a payload",
            p + item(3, b"\x00"),
            [PRE],
            f"telemetry stream: oversized heartbeat item at byte {after}: 1 bytes, limit 0",
        ),
        vector(
            "end item without its code",
            p + item(4, b"\x01"),
            [PRE],
            f"telemetry stream: short end item at byte {after}: 1 bytes, needs 2",
        ),
        vector(
            "end message over 1024 bytes",
            p + item(4, b"\x01\x00" + b"x" * 1025),
            [PRE],
            f"telemetry stream: oversized end item at byte {after}: 1027 bytes, limit 1026",
        ),
        vector(
            "end message not UTF-8",
            p + end(1, b"\xff\xfe"),
            [PRE],
            f"telemetry stream: end item at byte {after}: invalid UTF-8 message",
        ),
        vector(
            "data after the end item",
            p + end(1, b"bye") + heartbeat(),
            [PRE, {"kind": "end", "code": 1, "message": "bye"}],
            f"telemetry stream: data after the end item at byte {after + 10}",
        ),
        # ---------------------------------------------------------------- the connection closes
        vector(
            "closed without an end item (connection lost)",
            p + frame(FRAME_TINY) + heartbeat(),
            [PRE, f(FRAME_TINY), HB],
            "telemetry stream: connection closed without an end item",
        ),
        vector(
            "closed inside an item header",
            p + heartbeat()[:3],
            [PRE],
            f"telemetry stream: truncated item header at byte {after}: 3 of 5 bytes",
        ),
        vector(
            "closed inside a frame item",
            p + heartbeat() + frame(FRAME_V1)[:45],
            [PRE, HB],
            f"telemetry stream: truncated frame item at byte {after + 5}: "
            f"40 of {len(FRAME_V1)} bytes",
        ),
    ]


def render(vectors: list[Vector]) -> str:
    return json.dumps({"vectors": vectors}, indent=1, ensure_ascii=False) + "\n"


def main() -> int:
    text = render(all_vectors())
    if "--check" in sys.argv[1:]:
        if OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is stale: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
