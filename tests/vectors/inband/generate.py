"""Generate the normative in-band telemetry vectors (tests/vectors/inband/inband.json).

Each case is the data of one `event: parallelhue` SSE event and what a reader
must make of it (docs/PROTOCOL.md, "In-band telemetry"): the items (frames as
hex, the end item's fields and the reason it gives, if any), or the exact
error. The bytes are laid out here by hand (struct), not by the encoder under
test; both decoders (`parallelhue_vllm.inband.decode_event`, Rust
`parallelhue_core::inband::decode_event`) must pass them.

    python tests/vectors/inband/generate.py          # rewrite the JSON file
    python tests/vectors/inband/generate.py --check  # exit 1 if it differs
"""

from __future__ import annotations

import base64
import json
import struct
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "inband.json"

FRAME = b"PHUE" + bytes([3, 2, 0, 0]) + bytes(range(16)) + bytes(40)


def item(kind: int, payload: bytes) -> bytes:
    return struct.pack("<BI", kind, len(payload)) + payload


def end(status: int, frames: int, dropped: int, waited_us: int, reserved: int = 0) -> bytes:
    return item(2, struct.pack("<HHIII", status, reserved, frames, dropped, waited_us))


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def ok(name: str, raw: bytes, items: list[dict[str, object]]) -> dict[str, object]:
    return {"name": name, "data": b64(raw), "items": items}


def bad(name: str, data: str, error: str) -> dict[str, object]:
    return {"name": name, "data": data, "error": error}


def end_meaning(
    status: int, frames: int, dropped: int, waited: int, reason: str | None
) -> dict[str, object]:
    return {"kind": "end", "status": status, "frames": frames, "dropped": dropped,
            "waited_us": waited, "reason": reason}  # fmt: skip


CASES = [
    ok("one frame", item(1, FRAME), [{"kind": "frame", "hex": FRAME.hex()}]),
    ok("two frames", item(1, FRAME) + item(1, b"\x01"),
       [{"kind": "frame", "hex": FRAME.hex()}, {"kind": "frame", "hex": "01"}]),
    ok("frame then end", item(1, FRAME) + end(0, 1, 0, 1234),
       [{"kind": "frame", "hex": FRAME.hex()}, end_meaning(0, 1, 0, 1234, None)]),
    ok("scheduler missing", end(1, 0, 0, 5_000_999),
       [end_meaning(1, 0, 0, 5_000_999, "telemetry lost: the scheduler's frames of the final "
                                        "step did not come within 5000 ms")]),
    ok("text missing", end(2, 3, 0, 999),
       [end_meaning(2, 3, 0, 999, "telemetry lost: the detokenizer's frames of the final step "
                                  "did not come within 0 ms")]),
    ok("both missing", end(3, 0, 0, 2_000_000),
       [end_meaning(3, 0, 0, 2_000_000, "telemetry lost: no frame of the final step came "
                                        "within 2000 ms")]),
    ok("dropped", end(4, 2, 9, 0),
       [end_meaning(4, 2, 9, 0, "telemetry lost: 9 frames dropped by the server (the response "
                                "was read too slowly)")]),
    ok("hub closed", end(5, 0, 0, 0),
       [end_meaning(5, 0, 0, 0, "telemetry lost: the server's telemetry hub shut down")]),
    ok("unknown status", end(77, 0, 0, 0),
       [end_meaning(77, 0, 0, 0, "telemetry lost: the server ended this response's telemetry "
                                 "with status 77")]),
    ok("a longer frame", item(1, bytes(300)), [{"kind": "frame", "hex": "00" * 300}]),
    bad("empty", "", "in-band telemetry: event data is not base64"),
    bad("not base64", "QUJD!A==", "in-band telemetry: event data is not base64"),
    bad("whitespace", "QUJD QUJD", "in-band telemetry: event data is not base64"),
    bad("unpadded", "QQ", "in-band telemetry: event data is not base64"),
    bad("non-canonical", "QR==", "in-band telemetry: event data is not base64"),
    bad("padding inside", "QQ==QUJD", "in-band telemetry: event data is not base64"),
    bad("three pads", "Q===", "in-band telemetry: event data is not base64"),
    bad("non-ascii", "QUJ\u00e9", "in-band telemetry: event data is not base64"),
    bad("unknown type", b64(item(3, b"")), "in-band telemetry: unknown item type 3 at byte 0"),
    bad("type zero after a frame", b64(item(1, b"\x01") + item(0, b"")),
        "in-band telemetry: unknown item type 0 at byte 6"),
    bad("empty frame", b64(item(1, b"")),
        "in-band telemetry: frame item at byte 0 of 0 bytes (1..=65536)"),
    bad("oversized frame", b64(struct.pack("<BI", 1, 65537)),
        "in-band telemetry: frame item at byte 0 of 65537 bytes (1..=65536)"),
    bad("short end", b64(item(2, bytes(15))),
        "in-band telemetry: end item at byte 0 of 15 bytes (exactly 16)"),
    bad("reserved set", b64(end(0, 0, 0, 0, reserved=2)),
        "in-band telemetry: end item at byte 0: reserved 2"),
    bad("cut header", b64(item(1, b"\x01") + b"\x01\x01"),
        "in-band telemetry: truncated item header at byte 6: 2 of 5 bytes"),
    bad("cut payload", b64(struct.pack("<BI", 1, 10) + b"abc"),
        "in-band telemetry: truncated item at byte 0: 3 of 10 bytes"),
]  # fmt: skip


def render() -> str:
    doc = {
        "doc": "docs/PROTOCOL.md, In-band telemetry (stream version 2); generated by "
        "tests/vectors/inband/generate.py",
        "cases": CASES,
    }
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    text = render()
    if "--check" in sys.argv:
        sys.exit(0 if OUT.read_text(encoding="utf-8") == text else 1)
    OUT.write_text(text, encoding="utf-8")
