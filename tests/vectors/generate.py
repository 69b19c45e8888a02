"""Generate the normative protocol test vectors in tests/vectors/*.json.

Valid frames come from the real encoder (parallelhue_vllm.wire); invalid frames
are built by hand, byte by byte, so that each one violates exactly the rule it
is named after (or, for the check-order vectors, several rules at once, the
expected error being the first in the protocol's order).

    python tests/vectors/generate.py          # rewrite the JSON files
    python tests/vectors/generate.py --check  # exit 1 if they differ

tests/test_vectors.py checks that the committed files equal this output.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for extra in (ROOT / "plugin", ROOT / "python"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from parallelhue.reference.decode import decode_frame, frame_meaning  # noqa: E402
from parallelhue_vllm import wire  # noqa: E402

VECTOR_DIR = Path(__file__).resolve().parent
RUN_ID = bytes.fromhex("5f0e3c2a9b8d4e61a7c0f1d2e3b4a596")
SCHEDULER = 0x1122334455667788
FRONTEND = 0x0102030405060708

Vector = dict[str, Any]


def header(
    seq: int = 1,
    step: int = 7,
    source: int = SCHEDULER,
    dropped: int = 0,
    timestamp: int = 1_000_000_123,
) -> wire.Header:
    return wire.Header(RUN_ID, source, seq, step, timestamp, dropped)


def raw_frame(
    kind: int,
    body: bytes,
    *,
    magic: bytes = b"PHUE",
    version: int = wire.PROTOCOL_VERSION,
    flags: int = 0,
    source: int = SCHEDULER,
    seq: int = 1,
    step: int = 7,
    timestamp: int = 1_000_000_123,
    dropped: int = 0,
    body_len: int | None = None,
) -> bytes:
    """A frame with every header field under the caller's control."""
    length = len(body) if body_len is None else body_len
    head = struct.pack(
        "<4sBBH16sQQQQII",
        magic,
        version,
        kind,
        flags,
        RUN_ID,
        source,
        seq,
        step,
        timestamp,
        dropped,
        length,
    )
    return head + body


def hello_body(
    role: int = 1,
    engine: int = 1,
    derivation: int = 1,
    async_scheduling: int = 0,
    k: int = 3,
    verification: int = 1,
    plugin_version: bytes = b"0.3.0",
    engine_version: bytes = b"0.32.0+cpu",
    spec_method: bytes = b"ngram",
) -> bytes:
    parts = [struct.pack("<BBBBHH", role, engine, derivation, async_scheduling, k, verification)]
    for value in (plugin_version, engine_version, spec_method):
        parts.append(bytes((len(value),)) + value)
    return b"".join(parts)


def prov_record(
    stream: int = 0,
    flags: int = 0,
    reason: int = 0,
    offset: int = 0,
    ids: list[int] | None = None,
    roles: list[int] | None = None,
    scheduled: int = 3,
    padded: int = 0,
    n_tokens: int | None = None,
) -> bytes:
    ids = [101, 102, 103, 104] if ids is None else ids
    roles = [1, 1, 1, 3] if roles is None else roles
    count = len(ids) if n_tokens is None else n_tokens
    return (
        struct.pack("<HBBIHHH", stream, flags, reason, offset, count, scheduled, padded)
        + struct.pack(f"<{len(ids)}I", *ids)
        + bytes(roles)
    )


def text_record(
    stream: int = 0,
    flags: int = 0,
    reason: int = 0,
    offset: int = 0,
    tokens: list[tuple[int, ...]] | None = None,
    http: bytes | None = None,
    trimmed: int = 0,
    n_tokens: int | None = None,
    http_len: int | None = None,
) -> bytes:
    """Tokens are (id, fragment, span_back[, lead_len]); lead_len defaults to 0
    for a fragment without span_back and to unknown (0xFFFF) otherwise (a split
    with span_back, a give count on an empty fragment)."""
    tokens = [(201, b"Hi", 0), (202, b" there", 0)] if tokens is None else tokens
    entries = [
        (
            t[0],
            t[1],
            t[2],
            t[3] if len(t) > 3 else (0 if t[2] == 0 and t[1] else wire.LEAD_UNKNOWN),
        )
        for t in tokens
    ]
    http = b"".join(entry[1] for entry in entries) if http is None else http
    count = len(entries) if n_tokens is None else n_tokens
    length = len(http) if http_len is None else http_len
    return b"".join(
        [struct.pack("<HBBIHHI", stream, flags, reason, offset, count, trimmed, length)]
        + [struct.pack("<IHBH", tid, len(frag), back, lead) for tid, frag, back, lead in entries]
        + [entry[1] for entry in entries]
        + [http]
    )


def notice_record(stream: int = 0, code: int = 5, message: bytes = b"x", length: int | None = None):
    size = len(message) if length is None else length
    return struct.pack("<HHH", stream, code, size) + message


def records_body(*records: bytes, count: int | None = None) -> bytes:
    return struct.pack("<H", len(records) if count is None else count) + b"".join(records)


def valid(name: str, frame: bytes) -> Vector:
    return {"name": name, "hex": frame.hex(), "frame": frame_meaning(decode_frame(frame))}


def invalid(name: str, frame: bytes, error: str) -> Vector:
    return {"name": name, "hex": frame.hex(), "error": error}


P, A, T, B = wire.ROLE_PLAIN, wire.ROLE_ACCEPTED, wire.ROLE_TARGET, wire.ROLE_BONUS
PROV, TEXT, NOTICE, HELLO = wire.KIND_PROVENANCE, wire.KIND_TEXT, wire.KIND_NOTICE, wire.KIND_HELLO


def header_vectors() -> dict[str, list[Vector]]:
    notice = wire.encode_records(NOTICE, header(), [wire.NoticeRecord(3, 5, "ok")])
    body = notice[64:]
    good = [
        valid(
            "header fields at their maxima",
            wire.encode_records(
                NOTICE,
                wire.Header(RUN_ID, 2**64 - 1, 2**64 - 1, 2**64 - 1, 2**64 - 1, 2**32 - 1),
                [wire.NoticeRecord(3, 5, "ok")],
            ),
        ),
        valid(
            "seq 0 step 0 timestamp 0",
            wire.encode_records(
                NOTICE, wire.Header(RUN_ID, 1, 0, 0, 0, 0), [wire.NoticeRecord(3, 5, "ok")]
            ),
        ),
        valid(
            "dropped counter",
            wire.encode_records(NOTICE, header(dropped=17), [wire.NoticeRecord(3, 5, "ok")]),
        ),
    ]
    bad = [
        invalid("empty datagram", b"", "truncated frame: 0 bytes, header needs 64"),
        invalid("63 bytes", notice[:63], "truncated frame: 63 bytes, header needs 64"),
        invalid(
            "65537 bytes",
            raw_frame(NOTICE, bytes(65537 - 64)),
            "oversized frame: 65537 bytes, limit 65536",
        ),
        invalid(
            "oversized wins over bad magic",
            raw_frame(NOTICE, bytes(65600 - 64), magic=b"XXXX"),
            "oversized frame: 65600 bytes, limit 65536",
        ),
        invalid(
            "bad magic",
            raw_frame(NOTICE, body, magic=b"PHUF"),
            "bad magic: expected 50485545, got 50485546",
        ),
        invalid(
            "bad magic wins over version",
            raw_frame(NOTICE, body, magic=b"\x00\xffab", version=9),
            "bad magic: expected 50485545, got 00ff6162",
        ),
        invalid(
            "version 0",
            raw_frame(NOTICE, body, version=0),
            "unsupported protocol version 0 (this build speaks 3)",
        ),
        invalid(
            "version 1 (a parallelhue-vllm 0.1 sender)",
            raw_frame(NOTICE, body, version=1),
            "unsupported protocol version 1 (this build speaks 3)",
        ),
        invalid(
            "version 2 (a parallelhue-vllm 0.2 sender)",
            raw_frame(NOTICE, body, version=2),
            "unsupported protocol version 2 (this build speaks 3)",
        ),
        invalid(
            "version 2 wins over kind",
            raw_frame(9, body, version=2),
            "unsupported protocol version 2 (this build speaks 3)",
        ),
        invalid(
            "version 4",
            raw_frame(NOTICE, body, version=4),
            "unsupported protocol version 4 (this build speaks 3)",
        ),
        invalid("kind 0", raw_frame(0, body), "unknown frame kind 0"),
        invalid("kind 5", raw_frame(5, body), "unknown frame kind 5"),
        invalid(
            "kind 255 wins over flags", raw_frame(255, body, flags=1), "unknown frame kind 255"
        ),
        invalid("flags 1", raw_frame(NOTICE, body, flags=1), "reserved header flags set: 1"),
        invalid(
            "flags 0x8000 wins over source 0",
            raw_frame(NOTICE, body, flags=0x8000, source=0),
            "reserved header flags set: 32768",
        ),
        invalid("source id 0", raw_frame(NOTICE, body, source=0), "source id 0 is reserved"),
        invalid(
            "source id 0 wins over body length",
            raw_frame(NOTICE, body, source=0, body_len=1),
            "source id 0 is reserved",
        ),
        invalid(
            "body_len too large",
            raw_frame(NOTICE, body, body_len=len(body) + 1),
            f"body length mismatch: header says {len(body) + 1}, datagram has {len(body)}",
        ),
        invalid(
            "body_len too small",
            raw_frame(NOTICE, body, body_len=2),
            f"body length mismatch: header says 2, datagram has {len(body)}",
        ),
        invalid(
            "header only, body_len says 4",
            raw_frame(NOTICE, b"", body_len=4),
            "body length mismatch: header says 4, datagram has 0",
        ),
    ]
    return {"valid": good, "invalid": bad}


# A table on purpose: one entry per vector, each read on its own (long by design).
def hello_vectors() -> dict[str, list[Vector]]:
    def hello_frame(**fields: Any) -> bytes:
        return raw_frame(HELLO, hello_body(**fields), seq=0, step=0)

    def encode_hello_fields(
        derivation: int, is_async: bool, k: int, method: str, verification: int
    ) -> bytes:
        return wire.encode_hello(
            header(seq=0, step=3),
            wire.Hello(wire.SOURCE_SCHEDULER, wire.ENGINE_VLLM, derivation, is_async, k,
                       "0.3.0", "0.32.0+cpu", method, verification),
        )  # fmt: skip

    good = [
        valid(
            "scheduler, vLLM, ngram K=3",
            wire.encode_hello(
                header(seq=0, step=0),
                wire.Hello(
                    wire.SOURCE_SCHEDULER,
                    wire.ENGINE_VLLM,
                    wire.DERIVATION_DRAFT_IDS,
                    False,
                    3,
                    "0.3.0",
                    "0.32.0+cpu",
                    "ngram",
                    wire.VERIFICATION_STANDARD,
                ),
            ),
        ),
        valid(
            "frontend, vLLM, no speculative decoding",
            wire.encode_hello(
                header(seq=0, step=0, source=FRONTEND),
                wire.Hello(
                    wire.SOURCE_FRONTEND,
                    wire.ENGINE_VLLM,
                    wire.DERIVATION_NONE,
                    False,
                    0,
                    "0.3.0",
                    "0.26.0",
                    "",
                    wire.VERIFICATION_NONE,
                ),
            ),
        ),
        valid(
            "scheduler, counts only under async scheduling, eagle3 K=7",
            wire.encode_hello(
                header(seq=0, step=12),
                wire.Hello(
                    wire.SOURCE_SCHEDULER,
                    wire.ENGINE_VLLM,
                    wire.DERIVATION_COUNTS,
                    True,
                    7,
                    "0.3.0",
                    "0.33.0",
                    "eagle3",
                    wire.VERIFICATION_UNKNOWN,
                ),
            ),
        ),
        valid(
            "scheduler without speculative decoding under async scheduling",
            encode_hello_fields(wire.DERIVATION_NONE, True, 0, "", wire.VERIFICATION_NONE),
        ),
        valid(
            "synthetic verification",
            encode_hello_fields(
                wire.DERIVATION_DRAFT_IDS, False, 2, "draft_model", wire.VERIFICATION_SYNTHETIC
            ),
        ),
        valid(
            "simulated engine, non-ASCII version string, 255-byte method, the largest K",
            wire.encode_hello(
                header(seq=0, step=0),
                wire.Hello(
                    wire.SOURCE_SCHEDULER,
                    wire.ENGINE_SIMULATED,
                    wire.DERIVATION_DRAFT_IDS,
                    False,
                    255,
                    "0.3.0-β",
                    "sim-1",
                    "m" * 255,
                    wire.VERIFICATION_FLY,
                ),
            ),
        ),
    ]
    bad = [
        invalid("empty body", raw_frame(HELLO, b"", seq=0), "truncated hello body at byte 64"),
        invalid("role 0", hello_frame(role=0), "hello: unknown role 0"),
        invalid("role 3", hello_frame(role=3), "hello: unknown role 3"),
        invalid("role wins over engine", hello_frame(role=7, engine=9), "hello: unknown role 7"),
        invalid("engine 0", hello_frame(engine=0), "hello: unknown engine 0"),
        invalid("engine 3", hello_frame(engine=3), "hello: unknown engine 3"),
        invalid("derivation 3", hello_frame(derivation=3), "hello: unknown role derivation 3"),
        invalid(
            "async_scheduling 2",
            hello_frame(async_scheduling=2),
            "hello: invalid async_scheduling 2",
        ),
        invalid(
            "K 256: a step of K + 1 tokens would not fit one record",
            hello_frame(k=256),
            "hello: num_speculative_tokens 256 exceeds 255 (a step of K + 1 tokens must fit "
            "one record)",
        ),
        invalid(
            "K 65535 wins over verification",
            hello_frame(k=65535, verification=9),
            "hello: num_speculative_tokens 65535 exceeds 255 (a step of K + 1 tokens must fit "
            "one record)",
        ),
        invalid("verification 5", hello_frame(verification=5), "hello: unknown verification 5"),
        invalid(
            "unknown verification wins over invalid UTF-8",
            hello_frame(verification=300, plugin_version=b"\xff"),
            "hello: unknown verification 300",
        ),
        invalid(
            "body cut inside the fixed fields",
            raw_frame(HELLO, hello_body()[:5], seq=0),
            "truncated hello body at byte 68",
        ),
        invalid(
            "body cut before a str8 length",
            raw_frame(HELLO, hello_body()[:8], seq=0),
            "truncated hello body at byte 72",
        ),
        invalid(
            "str8 longer than the rest of the body",
            raw_frame(HELLO, hello_body()[:11], seq=0),
            "truncated hello body at byte 73",
        ),
        invalid(
            "spec_method cut",
            raw_frame(HELLO, hello_body()[:-1], seq=0),
            "truncated hello body at byte 90",
        ),
        invalid(
            "invalid UTF-8 in plugin_version",
            hello_frame(plugin_version=b"0.1\xff"),
            "hello: invalid UTF-8 in plugin_version",
        ),
        invalid(
            "invalid UTF-8 in engine_version",
            hello_frame(engine_version=b"\xe3\x81"),
            "hello: invalid UTF-8 in engine_version",
        ),
        invalid(
            "invalid UTF-8 in spec_method",
            hello_frame(spec_method=b"\xc0\xaf"),
            "hello: invalid UTF-8 in spec_method",
        ),
        invalid(
            "method without K",
            hello_frame(k=0),
            "hello: inconsistent speculative fields (method 'ngram', K 0, derivation 1, "
            "verification 1)",
        ),
        invalid(
            "K without method",
            hello_frame(spec_method=b"", derivation=0, verification=0),
            "hello: inconsistent speculative fields (method '', K 3, derivation 0, verification 0)",
        ),
        invalid(
            "derivation none with method and K",
            hello_frame(derivation=0),
            "hello: inconsistent speculative fields (method 'ngram', K 3, derivation 0, "
            "verification 1)",
        ),
        invalid(
            "derivation without method and K",
            hello_frame(derivation=2, k=0, spec_method=b"", verification=0),
            "hello: inconsistent speculative fields (method '', K 0, derivation 2, verification 0)",
        ),
        invalid(
            "method without verification",
            hello_frame(verification=0),
            "hello: inconsistent speculative fields (method 'ngram', K 3, derivation 1, "
            "verification 0)",
        ),
        invalid(
            "verification without speculative decoding",
            hello_frame(derivation=0, k=0, spec_method=b"", verification=4),
            "hello: inconsistent speculative fields (method '', K 0, derivation 0, verification 4)",
        ),
        invalid(
            "inconsistency wins over trailing bytes",
            raw_frame(HELLO, hello_body(k=0) + b"\x00", seq=0),
            "hello: inconsistent speculative fields (method 'ngram', K 0, derivation 1, "
            "verification 1)",
        ),
        invalid(
            "draft ids under async scheduling",
            hello_frame(derivation=1, async_scheduling=1),
            "hello: role derivation 1 with async_scheduling 1",
        ),
        invalid(
            "counts without async scheduling",
            hello_frame(derivation=2, async_scheduling=0),
            "hello: role derivation 2 with async_scheduling 0",
        ),
        invalid(
            "inconsistency wins over derivation/async",
            hello_frame(derivation=2, async_scheduling=0, k=0),
            "hello: inconsistent speculative fields (method 'ngram', K 0, derivation 2, "
            "verification 1)",
        ),
        invalid(
            "frontend with speculative fields",
            hello_frame(role=2),
            "hello: frontend hello with speculative fields (method 'ngram', K 3, "
            "derivation 1, async_scheduling 0, verification 1)",
        ),
        invalid(
            "frontend under async scheduling",
            hello_frame(
                role=2, derivation=0, k=0, spec_method=b"", verification=0, async_scheduling=1
            ),
            "hello: frontend hello with speculative fields (method '', K 0, "
            "derivation 0, async_scheduling 1, verification 0)",
        ),
        invalid(
            "derivation/async wins over frontend",
            hello_frame(role=2, derivation=2, async_scheduling=0),
            "hello: role derivation 2 with async_scheduling 0",
        ),
        invalid(
            "trailing byte",
            raw_frame(HELLO, hello_body() + b"\x00", seq=0),
            "1 trailing bytes after hello body",
        ),
        invalid(
            "three trailing bytes",
            raw_frame(HELLO, hello_body() + b"abc", seq=0),
            "3 trailing bytes after hello body",
        ),
    ]
    return {"valid": good, "invalid": bad}


# A table on purpose: one entry per vector, each read on its own (long by design).
def provenance_vectors() -> dict[str, list[Vector]]:
    def prov(*records: bytes, count: int | None = None) -> bytes:
        return raw_frame(PROV, records_body(*records, count=count))

    def encode(*records: wire.ProvenanceRecord, **head: Any) -> bytes:
        return wire.encode_records(PROV, header(**head), list(records))

    def record(stream: int, offset: int, ids: list[int], roles: list[int], **kw: Any):
        return wire.ProvenanceRecord(stream, offset, ids, roles, **kw)

    good = [
        valid("one plain token", encode(record(0, 0, [7], [P], drafts_scheduled=0))),
        valid(
            "all three drafts accepted plus bonus",
            encode(record(0, 1, [101, 102, 103, 104], [A, A, A, B], drafts_scheduled=3)),
        ),
        valid(
            "one accepted then target correction",
            encode(record(2, 40, [9, 4_000_000_000], [A, T], drafts_scheduled=3)),
        ),
        valid("no draft accepted", encode(record(0, 5, [55], [T], drafts_scheduled=4))),
        valid(
            "padded drafts counted",
            encode(record(1, 9, [1, 2], [A, T], drafts_scheduled=4, drafts_padded=2)),
        ),
        valid(
            "all drafts padded, only the target's token",
            encode(record(1, 9, [3], [T], drafts_scheduled=2, drafts_padded=2)),
        ),
        valid(
            "accepted up to the unpadded drafts",
            encode(record(1, 9, [1, 2, 3], [A, A, T], drafts_scheduled=3, drafts_padded=1)),
        ),
        valid(
            "stop token trims the step, finished",
            encode(
                record(
                    3,
                    17,
                    [11, 12],
                    [A, A],
                    drafts_scheduled=3,
                    finished=True,
                    finish_reason=wire.FINISH_STOP,
                    trimmed=True,
                )
            ),
        ),
        valid(
            "max_tokens ends on a bonus, finished length",
            encode(
                record(
                    3,
                    20,
                    [11, 12, 13],
                    [A, A, B],
                    drafts_scheduled=2,
                    finished=True,
                    finish_reason=wire.FINISH_LENGTH,
                )
            ),
        ),
        valid(
            "aborted",
            encode(
                record(
                    0,
                    3,
                    [8],
                    [P],
                    drafts_scheduled=0,
                    finished=True,
                    finish_reason=wire.FINISH_ABORT,
                )
            ),
        ),
        valid(
            "trimmed to zero accepted would be one accepted",
            encode(record(4, 0, [77], [A], drafts_scheduled=1, trimmed=True)),
        ),
        valid(
            "several streams in one step",
            encode(
                record(0, 10, [1, 2], [A, T], drafts_scheduled=2),
                record(5, 0, [3], [P], drafts_scheduled=0),
                record(65534, 4, [4, 5, 6], [A, A, B], drafts_scheduled=2),
                step=99,
                seq=42,
            ),
        ),
        valid(
            "256 tokens ending exactly at u32 max",
            encode(
                record(
                    0,
                    2**32 - 1 - 256,
                    list(range(256)),
                    [A] * 255 + [B],
                    drafts_scheduled=255,
                )
            ),
        ),
    ]
    bad = [
        invalid("empty body", raw_frame(PROV, b""), "truncated provenance body at byte 64"),
        invalid("record count 0", prov(count=0), "record count 0 out of range 1..=1024"),
        invalid(
            "record count 1025",
            prov(prov_record(), count=1025),
            "record count 1025 out of range 1..=1024",
        ),
        invalid(
            "record count says 2, one present",
            prov(prov_record(), count=2),
            "truncated provenance body at byte 100",
        ),
        invalid(
            "repeated stream",
            prov(prov_record(stream=4), prov_record(stream=4, offset=4)),
            "stream 4 appears twice in one frame",
        ),
        invalid(
            "stream 65535",
            prov(prov_record(stream=0xFFFF)),
            "stream 65535 is reserved",
        ),
        invalid(
            "flags bit2",
            prov(prov_record(stream=2, flags=4)),
            "record for stream 2: invalid flags 4",
        ),
        invalid(
            "flags 0x81 wins over finish reason",
            prov(prov_record(stream=2, flags=0x81, reason=9)),
            "record for stream 2: invalid flags 129",
        ),
        invalid(
            "finished without reason",
            prov(prov_record(stream=1, flags=1, reason=0)),
            "record for stream 1: finish reason 0 with finished=1",
        ),
        invalid(
            "reason without finished",
            prov(prov_record(stream=1, flags=0, reason=2)),
            "record for stream 1: finish reason 2 with finished=0",
        ),
        invalid(
            "unknown finish reason",
            prov(prov_record(stream=1, flags=1, reason=5)),
            "record for stream 1: finish reason 5 with finished=1",
        ),
        invalid(
            "zero tokens",
            prov(prov_record(stream=6, ids=[], roles=[])),
            "record for stream 6: 0 tokens out of range 1..=256",
        ),
        invalid(
            "257 tokens",
            prov(prov_record(stream=6, ids=list(range(257)), roles=[A] * 256 + [B], scheduled=256)),
            "record for stream 6: 257 tokens out of range 1..=256",
        ),
        invalid(
            "offset overflow",
            prov(prov_record(stream=6, offset=2**32 - 3)),
            "record for stream 6: offset 4294967293 + 4 tokens overflows u32",
        ),
        invalid(
            "accepted a padded draft",
            prov(prov_record(stream=6, ids=[1, 2], roles=[A, T], scheduled=3, padded=3)),
            "record for stream 6: 1 accepted drafts exceed 3 scheduled minus 3 padded",
        ),
        invalid(
            "bonus with a padded draft",
            prov(prov_record(stream=6, ids=[1, 2, 3], roles=[A, A, B], scheduled=2, padded=1)),
            "record for stream 6: 2 accepted drafts exceed 2 scheduled minus 1 padded",
        ),
        invalid(
            "trimmed step accepted more than the unpadded drafts",
            prov(prov_record(stream=6, ids=[1, 2], roles=[A, A], scheduled=3, padded=2, flags=2)),
            "record for stream 6: 2 accepted drafts exceed 3 scheduled minus 2 padded",
        ),
        invalid(
            "role sequence wins over padding",
            prov(prov_record(stream=6, ids=[1, 2], roles=[A, P], scheduled=3, padded=3)),
            "record for stream 6: invalid role sequence AP",
        ),
        invalid(
            "padded exceed scheduled",
            prov(prov_record(stream=6, scheduled=2, padded=3, ids=[1, 2, 3], roles=[A, A, B])),
            "record for stream 6: 3 padded drafts exceed 2 scheduled",
        ),
        invalid(
            "unknown role",
            prov(prov_record(stream=6, roles=[A, A, 4, B])),
            "record for stream 6: unknown role 4 at token 2",
        ),
        invalid(
            "unknown role wins over sequence",
            prov(prov_record(stream=6, roles=[P, B, A, 200])),
            "record for stream 6: unknown role 200 at token 3",
        ),
        invalid(
            "plain inside a speculative step",
            prov(prov_record(stream=6, roles=[A, A, P, T])),
            "record for stream 6: invalid role sequence AAPT",
        ),
        invalid(
            "two plain tokens without drafts",
            prov(prov_record(stream=6, ids=[1, 2], roles=[P, P], scheduled=0)),
            "record for stream 6: invalid role sequence PP",
        ),
        invalid(
            "accepted without drafts",
            prov(prov_record(stream=6, ids=[1], roles=[A], scheduled=0, flags=2)),
            "record for stream 6: invalid role sequence A",
        ),
        invalid(
            "plain with drafts scheduled",
            prov(prov_record(stream=6, ids=[1], roles=[P], scheduled=2)),
            "record for stream 6: invalid role sequence P",
        ),
        invalid(
            "bonus before all drafts accepted",
            prov(prov_record(stream=6, ids=[1, 2], roles=[A, B], scheduled=3)),
            "record for stream 6: invalid role sequence AB",
        ),
        invalid(
            "target after all drafts accepted",
            prov(prov_record(stream=6, roles=[A, A, A, T], scheduled=3)),
            "record for stream 6: invalid role sequence AAAT",
        ),
        invalid(
            "more accepted than scheduled",
            prov(prov_record(stream=6, ids=[1, 2, 3], roles=[A, A, B], scheduled=1)),
            "record for stream 6: invalid role sequence AAB",
        ),
        invalid(
            "target not last",
            prov(prov_record(stream=6, ids=[1, 2], roles=[T, A], scheduled=3)),
            "record for stream 6: invalid role sequence TA",
        ),
        invalid(
            "untrimmed step without target or bonus",
            prov(prov_record(stream=6, ids=[1, 2], roles=[A, A], scheduled=3)),
            "record for stream 6: invalid role sequence AA",
        ),
        invalid(
            "trimmed step accepting more than scheduled",
            prov(prov_record(stream=6, ids=[1, 2, 3], roles=[A, A, A], scheduled=2, flags=2)),
            "record for stream 6: invalid role sequence AAA",
        ),
        invalid(
            "cut inside the record fields",
            prov(prov_record(stream=6))[: 64 + 2 + 9],
            "truncated provenance body at byte 74",
        ),
        invalid(
            "cut inside the token ids",
            prov(prov_record(stream=6))[: 64 + 2 + 14 + 6],
            "truncated provenance body at byte 80",
        ),
        invalid(
            "cut inside the roles",
            prov(prov_record(stream=6))[:-1],
            "truncated provenance body at byte 96",
        ),
        invalid(
            "an error in the first record wins over a missing second record",
            prov(prov_record(stream=1, roles=[A, A, A, A]), count=2),
            "record for stream 1: invalid role sequence AAAA",
        ),
        invalid(
            "trailing bytes",
            prov(prov_record(stream=6)) + b"\x00\x00",
            "2 trailing bytes after provenance body",
        ),
    ]
    # The hand-built frames above set body_len from the untruncated body; fix it up so the
    # truncation is seen in the body, not as a header length mismatch.
    bad = [_fix_body_len(vector) for vector in bad]
    return {"valid": good, "invalid": bad}


def _fix_body_len(vector: Vector) -> Vector:
    frame = bytes.fromhex(vector["hex"])
    if len(frame) >= 64:
        frame = frame[:60] + struct.pack("<I", len(frame) - 64) + frame[64:]
        vector = dict(vector, hex=frame.hex())
    return vector


# A table on purpose: one entry per vector, each read on its own (long by design).
def text_vectors() -> dict[str, list[Vector]]:
    def text(*records: bytes, count: int | None = None) -> bytes:
        return raw_frame(TEXT, records_body(*records, count=count), source=FRONTEND)

    def encode(*records: wire.TextRecord, **head: Any) -> bytes:
        return wire.encode_records(TEXT, header(source=FRONTEND, **head), list(records))

    tok = wire.TextToken
    ni = "日".encode()  # e6 97 a5
    smile = "😀".encode()  # f0 9f 98 80
    good = [
        valid(
            "ASCII tokens",
            encode(wire.TextRecord(0, 0, [tok(201, b"Hi"), tok(202, b" there")], b"Hi there")),
        ),
        valid(
            "CJK character split over two tokens",
            encode(
                wire.TextRecord(
                    1, 12, [tok(300, b""), tok(301, ni, 1, 2), tok(302, b"!")], ni + b"!"
                )
            ),
        ),
        valid(
            "emoji over four tokens",
            encode(
                wire.TextRecord(
                    1,
                    3,
                    [tok(1, b""), tok(2, b""), tok(3, b""), tok(4, smile, 3, 3)],
                    smile,
                )
            ),
        ),
        valid(
            "lead_len: 'a' and half a character from the predecessor, 'b' from the carrier",
            encode(
                wire.TextRecord(
                    1, 0, [tok(300, b""), tok(301, b"a" + ni + b"b", 1, 2)], b"a" + ni + b"b"
                )
            ),
        ),
        valid(
            "give counts: 'Ġthe\\xe6' gives 5 bytes, '\\x97' gives 1, "
            "the carrier ' the日x' has lead_len 6",
            encode(
                wire.TextRecord(
                    1,
                    4,
                    [tok(300, b"", 0, 5), tok(301, b"", 0, 1), tok(302, b" the" + ni + b"x", 2, 6)],
                    b" the" + ni + b"x",
                )
            ),
        ),
        valid(
            "give count 0 (a skipped special token between byte tokens), lead_len below span_back",
            encode(
                wire.TextRecord(1, 0, [tok(1, b"", 0, 1), tok(2, b"", 0, 0), tok(3, ni, 2, 1)], ni)
            ),
        ),
        valid(
            "give count unknown, and a give count on an empty fragment of its own record",
            encode(
                wire.TextRecord(1, 0, [tok(1, b"", 0, wire.LEAD_UNKNOWN), tok(2, b"", 0, 2)], b"")
            ),
        ),
        valid(
            "lead_len 0 with span_back (the predecessors gave nothing)",
            encode(wire.TextRecord(1, 0, [tok(1, b"", 0, 0), tok(2, b"ab", 1, 0)], b"ab")),
        ),
        valid(
            "lead_len unknown",
            encode(wire.TextRecord(1, 0, [tok(1, b""), tok(2, ni, 1, wire.LEAD_UNKNOWN)], ni)),
        ),
        valid(
            "lead_len equal to the fragment",
            encode(wire.TextRecord(1, 0, [tok(1, b""), tok(2, b""), tok(3, ni, 2, 3)], ni)),
        ),
        valid(
            "token ends inside a character: empty fragment, empty http delta",
            encode(wire.TextRecord(2, 0, [tok(400, b"")], b"")),
        ),
        valid(
            "stop-string holdback: http delta shorter than fragments",
            encode(wire.TextRecord(2, 5, [tok(1, b"ab"), tok(2, b"cd")], b"a")),
        ),
        valid(
            "finished with no tokens, releases held-back text",
            encode(
                wire.TextRecord(2, 7, [], b"bcd", finished=True, finish_reason=wire.FINISH_STOP)
            ),
        ),
        valid(
            "0.26-style stop string: text truncated, ids kept",
            encode(
                wire.TextRecord(
                    3,
                    20,
                    [tok(5, b"x END"), tok(6, b" more")],
                    b"x",
                    finished=True,
                    finish_reason=wire.FINISH_STOP,
                    text_truncated=True,
                )
            ),
        ),
        valid(
            "0.33-style stop string: surplus tokens trimmed",
            encode(
                wire.TextRecord(
                    3,
                    20,
                    [tok(5, b"x END")],
                    b"x",
                    finished=True,
                    finish_reason=wire.FINISH_STOP,
                    text_truncated=True,
                    tokens_trimmed=True,
                    trimmed_tokens=2,
                )
            ),
        ),
        valid(
            "tokens_trimmed with zero trimmed tokens",
            encode(
                wire.TextRecord(
                    3,
                    1,
                    [tok(5, b"y")],
                    b"y",
                    finished=True,
                    finish_reason=wire.FINISH_STOP,
                    tokens_trimmed=True,
                )
            ),
        ),
        valid(
            "several streams in one step",
            encode(
                wire.TextRecord(0, 2, [tok(9, "é".encode())], "é".encode()),
                wire.TextRecord(
                    7,
                    0,
                    [tok(10, b"a"), tok(11, b"")],
                    b"a",
                    finished=True,
                    finish_reason=wire.FINISH_LENGTH,
                ),
                step=3,
                seq=9,
            ),
        ),
    ]
    bad = [
        invalid("record count 0", text(count=0), "record count 0 out of range 1..=1024"),
        invalid(
            "record count 2000",
            text(text_record(), count=2000),
            "record count 2000 out of range 1..=1024",
        ),
        invalid(
            "repeated stream",
            text(text_record(stream=9), text_record(stream=9, offset=2)),
            "stream 9 appears twice in one frame",
        ),
        invalid("stream 65535", text(text_record(stream=0xFFFF)), "stream 65535 is reserved"),
        invalid(
            "flags bit3",
            text(text_record(stream=1, flags=8)),
            "record for stream 1: invalid flags 8",
        ),
        invalid(
            "text_truncated without finished",
            text(text_record(stream=1, flags=2)),
            "record for stream 1: invalid flags 2",
        ),
        invalid(
            "tokens_trimmed without finished",
            text(text_record(stream=1, flags=4)),
            "record for stream 1: invalid flags 4",
        ),
        invalid(
            "finished without reason",
            text(text_record(stream=1, flags=1)),
            "record for stream 1: finish reason 0 with finished=1",
        ),
        invalid(
            "text_truncated with finish reason length",
            text(text_record(stream=1, flags=3, reason=2)),
            "record for stream 1: stop-string flags 3 with finish reason 2",
        ),
        invalid(
            "tokens_trimmed with finish reason abort",
            text(text_record(stream=1, flags=5, reason=3)),
            "record for stream 1: stop-string flags 5 with finish reason 3",
        ),
        invalid(
            "finish mismatch wins over stop-string flags",
            text(text_record(stream=1, flags=3, reason=0)),
            "record for stream 1: finish reason 0 with finished=1",
        ),
        invalid(
            "reason without finished",
            text(text_record(stream=1, reason=3)),
            "record for stream 1: finish reason 3 with finished=0",
        ),
        invalid(
            "zero tokens unfinished",
            text(text_record(stream=1, tokens=[], http=b"")),
            "record for stream 1: 0 tokens out of range 1..=256",
        ),
        invalid(
            "257 tokens finished",
            text(text_record(stream=1, flags=1, reason=1, tokens=[(1, b"a", 0)] * 257)),
            "record for stream 1: 257 tokens out of range 0..=256",
        ),
        invalid(
            "offset overflow",
            text(text_record(stream=1, offset=2**32 - 1)),
            "record for stream 1: offset 4294967295 + 2 tokens overflows u32",
        ),
        invalid(
            "trimmed_tokens without flag",
            text(text_record(stream=1, flags=3, reason=1, trimmed=2)),
            "record for stream 1: trimmed_tokens 2 without tokens_trimmed flag",
        ),
        invalid(
            "span_back on empty fragment",
            text(text_record(stream=1, tokens=[(1, b"", 0), (2, b"", 1)], http=b"")),
            "record for stream 1: span_back 1 on empty fragment at token 1",
        ),
        invalid(
            "lead_len without span_back",
            text(text_record(stream=1, tokens=[(1, b"ab", 0, 1)], http=b"ab")),
            "record for stream 1: lead_len 1 without span_back at token 0",
        ),
        invalid(
            "lead_len unknown without span_back",
            text(text_record(stream=1, tokens=[(1, b"ab", 0, 0xFFFF)], http=b"ab")),
            "record for stream 1: lead_len 65535 without span_back at token 0",
        ),
        invalid(
            "lead_len exceeds the fragment",
            text(text_record(stream=1, tokens=[(1, b"", 0), (2, b"ab", 1, 3)], http=b"ab")),
            "record for stream 1: lead_len 3 exceeds the 2-byte fragment at token 1",
        ),
        invalid(
            "span_back on empty fragment wins over lead_len",
            text(text_record(stream=1, tokens=[(1, b"", 1, 9)], http=b"")),
            "record for stream 1: span_back 1 on empty fragment at token 0",
        ),
        invalid(
            "token entry error wins over invalid UTF-8",
            text(text_record(stream=1, tokens=[(1, b"\xff", 0, 1)], http=b"")),
            "record for stream 1: lead_len 1 without span_back at token 0",
        ),
        invalid(
            "invalid UTF-8 fragment: half a character",
            text(text_record(stream=1, tokens=[(1, b"a", 0), (2, ni[:2], 0)], http=b"a")),
            "record for stream 1: invalid UTF-8 in fragment of token 1",
        ),
        invalid(
            "invalid UTF-8 fragment wins over http delta",
            text(text_record(stream=1, tokens=[(1, b"\xff", 0)], http=b"\xff")),
            "record for stream 1: invalid UTF-8 in fragment of token 0",
        ),
        invalid(
            "invalid UTF-8 in http delta",
            text(text_record(stream=1, tokens=[(1, ni, 0)], http=ni[1:])),
            "record for stream 1: invalid UTF-8 in http delta",
        ),
        invalid(
            "surrogate in http delta",
            text(text_record(stream=1, tokens=[(1, b"a", 0)], http=b"\xed\xa0\x80")),
            "record for stream 1: invalid UTF-8 in http delta",
        ),
        invalid(
            "cut inside the token table",
            text(text_record(stream=1))[: 64 + 2 + 16 + 3],
            "truncated text body at byte 82",
        ),
        invalid(
            "cut inside the fragments",
            text(text_record(stream=1))[: 64 + 2 + 16 + 18 + 3],
            "truncated text body at byte 100",
        ),
        invalid(
            "cut inside the http delta",
            text(text_record(stream=1))[:-1],
            "truncated text body at byte 108",
        ),
        invalid(
            "http_len beyond the body",
            text(text_record(stream=1, http_len=100)),
            "truncated text body at byte 108",
        ),
        invalid(
            "trailing bytes",
            text(text_record(stream=1)) + b"\x00",
            "1 trailing bytes after text body",
        ),
    ]
    bad = [_fix_body_len(vector) for vector in bad]
    return {"valid": good, "invalid": bad}


def notice_vectors() -> dict[str, list[Vector]]:
    def notice(*records: bytes, count: int | None = None) -> bytes:
        return raw_frame(NOTICE, records_body(*records, count=count), source=FRONTEND)

    def encode(*records: wire.NoticeRecord) -> bytes:
        return wire.encode_records(NOTICE, header(source=FRONTEND), list(records))

    # Exactly MAX_FRAME_BYTES: 63 notices of 1024 bytes and one filling the rest.
    full = [wire.NoticeRecord(i, wire.NOTICE_OTHER, "z" * 1024) for i in range(63)]
    full.append(wire.NoticeRecord(63, wire.NOTICE_OTHER, "z" * (65536 - 66 - 64 * 1030 + 1024)))
    good = [
        valid(
            "stream_interval for the whole run",
            encode(
                wire.NoticeRecord(
                    wire.ALL_STREAMS,
                    wire.NOTICE_STREAM_INTERVAL,
                    "stream_interval is 4, exact mode needs 1",
                )
            ),
        ),
        valid(
            "hook error for one stream, non-ASCII message",
            encode(wire.NoticeRecord(3, wire.NOTICE_HOOK_ERROR, "KeyError: 'ストリーム'")),
        ),
        valid("empty message", encode(wire.NoticeRecord(0, wire.NOTICE_N, ""))),
        valid(
            "two notices for the same stream",
            encode(
                wire.NoticeRecord(1, wire.NOTICE_N, "n=2"),
                wire.NoticeRecord(1, wire.NOTICE_UNSUPPORTED, "vLLM 0.20"),
            ),
        ),
        valid("frame of exactly 65536 bytes", encode(*full)),
    ]
    bad = [
        invalid("record count 0", notice(count=0), "record count 0 out of range 1..=1024"),
        invalid(
            "record count 1025",
            notice(notice_record(), count=1025),
            "record count 1025 out of range 1..=1024",
        ),
        invalid(
            "message of 1025 bytes",
            notice(notice_record(stream=4, message=b"q" * 1025)),
            "notice for stream 4: message of 1025 bytes exceeds 1024",
        ),
        invalid(
            "too long wins over truncation",
            notice(notice_record(stream=4, message=b"", length=2000)),
            "notice for stream 4: message of 2000 bytes exceeds 1024",
        ),
        invalid(
            "invalid UTF-8 message",
            notice(notice_record(stream=65535, message=b"bad \xfe")),
            "notice for stream 65535: invalid UTF-8 message",
        ),
        invalid(
            "message cut",
            notice(notice_record(stream=4, message=b"abc", length=5)),
            "truncated notice body at byte 72",
        ),
        invalid(
            "cut inside the record fields",
            notice(notice_record(stream=4))[:69],
            "truncated notice body at byte 68",
        ),
        invalid(
            "trailing bytes",
            notice(notice_record()) + b"\x01\x02\x03\x04",
            "4 trailing bytes after notice body",
        ),
    ]
    bad = [_fix_body_len(vector) for vector in bad]
    return {"valid": good, "invalid": bad}


def all_vectors() -> dict[str, dict[str, list[Vector]]]:
    return {
        "header": header_vectors(),
        "hello": hello_vectors(),
        "provenance": provenance_vectors(),
        "text": text_vectors(),
        "notice": notice_vectors(),
    }


def render(vectors: dict[str, list[Vector]]) -> str:
    return json.dumps(vectors, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, vectors in all_vectors().items():
        path = VECTOR_DIR / f"{name}.json"
        text = render(vectors)
        if check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(path.name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print("stale vectors (run tests/vectors/generate.py): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
