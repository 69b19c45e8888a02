"""Frame encoder for the ParallelHue telemetry protocol, version 3 (docs/PROTOCOL.md).

Shared by the vLLM plugin and the embedded simulated engine. Pure standard
library and cheap: it runs inside vLLM's scheduler and output-processor loops.
The encoder trusts its caller for semantic rules (role sequences, flag
combinations); the decoders enforce them. It does refuse frames that could not
be represented (field overflow, too many records or tokens, oversize frames).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

__all__ = [
    "ALL_STREAMS",
    "DERIVATION_COUNTS",
    "DERIVATION_DRAFT_IDS",
    "DERIVATION_NONE",
    "ENGINE_SIMULATED",
    "ENGINE_VLLM",
    "FINISH_ABORT",
    "FINISH_ERROR",
    "FINISH_LENGTH",
    "FINISH_NAMES",
    "FINISH_NONE",
    "FINISH_STOP",
    "HEADER_SIZE",
    "KIND_HELLO",
    "KIND_NAMES",
    "KIND_NOTICE",
    "KIND_PROVENANCE",
    "KIND_TEXT",
    "LEAD_UNKNOWN",
    "MAGIC",
    "MAX_FRAME_BYTES",
    "MAX_NOTICE_BYTES",
    "MAX_RECORDS",
    "MAX_STR8",
    "MAX_TOKENS_PER_RECORD",
    "NOTICE_HOOK_BYPASSED",
    "NOTICE_HOOK_ERROR",
    "NOTICE_N",
    "NOTICE_OTHER",
    "NOTICE_ROLES_UNVERIFIABLE",
    "NOTICE_STREAM_INTERVAL",
    "NOTICE_UNSUPPORTED",
    "PROTOCOL_VERSION",
    "REQUEST_ID_PATTERN",
    "ROLE_ACCEPTED",
    "ROLE_BONUS",
    "ROLE_PLAIN",
    "ROLE_TARGET",
    "SOURCE_FRONTEND",
    "SOURCE_SCHEDULER",
    "UNTESTED_MARK",
    "VERIFICATION_FLY",
    "VERIFICATION_NONE",
    "VERIFICATION_STANDARD",
    "VERIFICATION_SYNTHETIC",
    "VERIFICATION_UNKNOWN",
    "Header",
    "Hello",
    "NoticeRecord",
    "ProvenanceRecord",
    "Record",
    "TextRecord",
    "TextToken",
    "encode_hello",
    "encode_records",
    "parse_request_id",
    "record_size",
    "request_id",
    "split_for_frames",
]

PROTOCOL_VERSION = 3
MAGIC = b"PHUE"

KIND_HELLO, KIND_PROVENANCE, KIND_TEXT, KIND_NOTICE = 1, 2, 3, 4
ROLE_PLAIN, ROLE_ACCEPTED, ROLE_TARGET, ROLE_BONUS = 0, 1, 2, 3
FINISH_NONE, FINISH_STOP, FINISH_LENGTH, FINISH_ABORT, FINISH_ERROR = 0, 1, 2, 3, 4
# The OpenAI `finish_reason` of each code (what the SSE stream says for it).
FINISH_NAMES = {FINISH_STOP: "stop", FINISH_LENGTH: "length", FINISH_ABORT: "abort",
                FINISH_ERROR: "error"}  # fmt: skip
SOURCE_SCHEDULER, SOURCE_FRONTEND = 1, 2
ENGINE_VLLM, ENGINE_SIMULATED = 1, 2
DERIVATION_NONE, DERIVATION_DRAFT_IDS, DERIVATION_COUNTS = 0, 1, 2
NOTICE_STREAM_INTERVAL, NOTICE_N, NOTICE_HOOK_ERROR, NOTICE_UNSUPPORTED, NOTICE_OTHER = (
    1,
    2,
    3,
    4,
    5,
)
# The engine cannot tell which drafts were verified (e.g. dspark adaptive verification).
NOTICE_ROLES_UNVERIFIABLE = 6
# An output reached the client without passing the hooks (e.g. vLLM 0.33's
# StreamingInputOutputCollector, or a request finished by an engine error).
NOTICE_HOOK_BYPASSED = 7
ALL_STREAMS = 0xFFFF
# Hello `verification`: how the engine verifies drafts.
VERIFICATION_NONE, VERIFICATION_STANDARD, VERIFICATION_SYNTHETIC = 0, 1, 2
VERIFICATION_FLY, VERIFICATION_UNKNOWN = 3, 4
# Text token `lead_len` when the sender does not know the byte split (a token with a
# fragment) or its give count (a token with an empty fragment).
LEAD_UNKNOWN = 0xFFFF
# After a hello's engine_version: the plugin's adapter matched this engine by its
# signatures, but this release was never tested with the plugin (the banner says so).
UNTESTED_MARK = " (untested)"

MAX_FRAME_BYTES = 65536
MAX_RECORDS = 1024
MAX_TOKENS_PER_RECORD = 256
MAX_STR8 = 255
MAX_NOTICE_BYTES = 1024
HEADER_SIZE = 64

REQUEST_ID_PATTERN = re.compile(r"ph1_([0-9a-f]{32})_([0-9]{1,5})")

# magic, version, kind, flags, run_id, source_id, seq, step, timestamp_ns, dropped, body_len
_HEADER = struct.Struct("<4sBBH16sQQQQII")
_COUNT = struct.Struct("<H")
# stream, flags, finish_reason, offset, n_tokens, drafts_scheduled, drafts_padded
_PROVENANCE = struct.Struct("<HBBIHHH")
# stream, flags, finish_reason, offset, n_tokens, trimmed_tokens, http_len
_TEXT = struct.Struct("<HBBIHHI")
# token_id, frag_len, span_back, lead_len
_TEXT_TOKEN = struct.Struct("<IHBH")
# stream, code, msg_len
_NOTICE = struct.Struct("<HHH")
# role, engine, role_derivation, async_scheduling, num_speculative_tokens, verification
_HELLO = struct.Struct("<BBBBHH")

assert _HEADER.size == HEADER_SIZE

_FLAG_FINISHED = 1
_FLAG_TRIMMED = 2
_FLAG_TEXT_TRUNCATED = 2
_FLAG_TOKENS_TRIMMED = 4

# The frame kinds by name, in error messages (the reference decoder's too).
KIND_NAMES = {
    KIND_HELLO: "hello",
    KIND_PROVENANCE: "provenance",
    KIND_TEXT: "text",
    KIND_NOTICE: "notice",
}

# One precompiled Struct per token count: packing a record's ids is then one call.
_ID_STRUCTS: list[struct.Struct] = [
    struct.Struct(f"<{n}I") for n in range(MAX_TOKENS_PER_RECORD + 1)
]


@dataclass(slots=True)
class Header:
    run_id: bytes  # 16 raw bytes
    source_id: int
    seq: int
    step: int
    timestamp_ns: int
    dropped: int = 0


@dataclass(slots=True)
class Hello:
    role: int
    engine: int
    role_derivation: int
    async_scheduling: bool
    num_speculative_tokens: int
    plugin_version: str
    engine_version: str
    spec_method: str
    verification: int  # VERIFICATION_*; VERIFICATION_NONE without speculative decoding


@dataclass(slots=True)
class ProvenanceRecord:
    stream: int
    offset: int
    token_ids: list[int]
    roles: list[int]
    drafts_scheduled: int
    drafts_padded: int = 0
    finished: bool = False
    finish_reason: int = 0
    trimmed: bool = False


@dataclass(slots=True)
class TextToken:
    token_id: int
    fragment: bytes
    span_back: int = 0
    # With a fragment: bytes at its start that came from the span_back predecessors
    # (0 when span_back is 0). With an empty fragment: the token's give count, how
    # many of its bytes the detokenizer carried into the next non-empty fragment
    # (0 when it gave nothing, e.g. a skipped special token). LEAD_UNKNOWN: not known.
    lead_len: int = 0


@dataclass(slots=True)
class TextRecord:
    stream: int
    offset: int
    tokens: list[TextToken]
    http_delta: bytes
    finished: bool = False
    finish_reason: int = 0
    text_truncated: bool = False
    tokens_trimmed: bool = False
    trimmed_tokens: int = 0


@dataclass(slots=True)
class NoticeRecord:
    stream: int
    code: int
    message: str


Record = ProvenanceRecord | TextRecord | NoticeRecord


def parse_request_id(request_id: str) -> tuple[str, int] | None:
    """Find `ph1_<run>_<stream>` anywhere in a vLLM request id.

    vLLM wraps the client's id (`chatcmpl-ph1_<run>_<i>-<8hex>`, `<k>_<...>` for
    n > 1 children). A stream index followed by more digits is not ours.
    """
    for match in REQUEST_ID_PATTERN.finditer(request_id):
        end = match.end()
        if end < len(request_id) and request_id[end].isdigit():
            continue
        stream = int(match.group(2))
        if stream >= ALL_STREAMS:
            continue
        return match.group(1), stream
    return None


def request_id(run_id: str, stream: int) -> str:
    """The request id the client sends for one stream of a run."""
    return f"ph1_{run_id}_{stream}"


def _header(kind: int, header: Header, body_len: int) -> bytes:
    return _HEADER.pack(
        MAGIC,
        PROTOCOL_VERSION,
        kind,
        0,
        header.run_id,
        header.source_id,
        header.seq,
        header.step,
        header.timestamp_ns,
        header.dropped,
        body_len,
    )


def _str8(value: str, name: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > MAX_STR8:
        raise ValueError(f"hello {name} is {len(raw)} bytes, limit {MAX_STR8}")
    return bytes((len(raw),)) + raw


def encode_hello(header: Header, hello: Hello) -> bytes:
    """Encode a hello frame (kind 1)."""
    if len(header.run_id) != 16:
        raise ValueError(f"run id must be 16 raw bytes, got {len(header.run_id)}")
    body = b"".join(
        (
            _HELLO.pack(
                hello.role,
                hello.engine,
                hello.role_derivation,
                1 if hello.async_scheduling else 0,
                hello.num_speculative_tokens,
                hello.verification,
            ),
            _str8(hello.plugin_version, "plugin_version"),
            _str8(hello.engine_version, "engine_version"),
            _str8(hello.spec_method, "spec_method"),
        )
    )
    return _header(KIND_HELLO, header, len(body)) + body


def _encode_provenance(record: ProvenanceRecord, parts: list[bytes]) -> None:
    ids = record.token_ids
    count = len(ids)
    if count > MAX_TOKENS_PER_RECORD:
        raise ValueError(
            f"record for stream {record.stream}: {count} tokens, limit {MAX_TOKENS_PER_RECORD}"
        )
    if len(record.roles) != count:
        raise ValueError(
            f"record for stream {record.stream}: {len(record.roles)} roles for {count} tokens"
        )
    flags = (_FLAG_FINISHED if record.finished else 0) | (_FLAG_TRIMMED if record.trimmed else 0)
    parts.append(
        _PROVENANCE.pack(
            record.stream,
            flags,
            record.finish_reason,
            record.offset,
            count,
            record.drafts_scheduled,
            record.drafts_padded,
        )
    )
    parts.append(_ID_STRUCTS[count].pack(*ids))
    parts.append(bytes(record.roles))


def _encode_text(record: TextRecord, parts: list[bytes]) -> None:
    tokens = record.tokens
    count = len(tokens)
    if count > MAX_TOKENS_PER_RECORD:
        raise ValueError(
            f"record for stream {record.stream}: {count} tokens, limit {MAX_TOKENS_PER_RECORD}"
        )
    flags = (
        (_FLAG_FINISHED if record.finished else 0)
        | (_FLAG_TEXT_TRUNCATED if record.text_truncated else 0)
        | (_FLAG_TOKENS_TRIMMED if record.tokens_trimmed else 0)
    )
    parts.append(
        _TEXT.pack(
            record.stream,
            flags,
            record.finish_reason,
            record.offset,
            count,
            record.trimmed_tokens,
            len(record.http_delta),
        )
    )
    pack_token = _TEXT_TOKEN.pack
    parts.extend([pack_token(t.token_id, len(t.fragment), t.span_back, t.lead_len) for t in tokens])
    parts.extend([t.fragment for t in tokens])
    parts.append(record.http_delta)


def _notice_message(record: NoticeRecord) -> bytes:
    """The message as UTF-8, cut at a character boundary to MAX_NOTICE_BYTES.

    Notices explain why a stream is not exact; a long explanation is cut, never refused.
    """
    raw = record.message.encode("utf-8")
    if len(raw) > MAX_NOTICE_BYTES:
        raw = raw[:MAX_NOTICE_BYTES].decode("utf-8", "ignore").encode("utf-8")
    return raw


def _encode_notice(record: NoticeRecord, parts: list[bytes]) -> None:
    message = _notice_message(record)
    parts.append(_NOTICE.pack(record.stream, record.code, len(message)))
    parts.append(message)


_RECORD_TYPES: dict[int, type] = {
    KIND_PROVENANCE: ProvenanceRecord,
    KIND_TEXT: TextRecord,
    KIND_NOTICE: NoticeRecord,
}


def _wrong_kind(kind: int, record: object) -> NoReturn:
    if kind not in _RECORD_TYPES:
        raise ValueError(f"kind {kind} does not carry records")
    raise ValueError(f"a {type(record).__name__} cannot go in a {KIND_NAMES[kind]} frame")


def encode_records(kind: int, header: Header, records: Sequence[Record]) -> bytes:
    """Encode a provenance, text or notice frame holding `records`.

    Raises ValueError if the records do not fit one frame: use split_for_frames.
    """
    if not 1 <= len(records) <= MAX_RECORDS:
        raise ValueError(f"{len(records)} records, a frame holds 1..={MAX_RECORDS}")
    if len(header.run_id) != 16:
        raise ValueError(f"run id must be 16 raw bytes, got {len(header.run_id)}")
    parts: list[bytes] = [b"", _COUNT.pack(len(records))]
    try:
        if kind == KIND_PROVENANCE:
            for record in records:
                if not isinstance(record, ProvenanceRecord):
                    _wrong_kind(kind, record)
                _encode_provenance(record, parts)
        elif kind == KIND_TEXT:
            for record in records:
                if not isinstance(record, TextRecord):
                    _wrong_kind(kind, record)
                _encode_text(record, parts)
        elif kind == KIND_NOTICE:
            for record in records:
                if not isinstance(record, NoticeRecord):
                    _wrong_kind(kind, record)
                _encode_notice(record, parts)
        else:
            _wrong_kind(kind, None)
    except struct.error as error:
        kind_name = KIND_NAMES[kind]
        raise ValueError(f"{kind_name} record field out of range: {error}") from error
    body = b"".join(parts)
    total = HEADER_SIZE + len(body)
    if total > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {total} bytes exceeds {MAX_FRAME_BYTES}")
    return _header(kind, header, len(body)) + body


def record_size(kind: int, record: Record) -> int:
    """Encoded size in bytes of one record of the given frame kind."""
    if not isinstance(record, _RECORD_TYPES.get(kind, ())):
        _wrong_kind(kind, record)
    if isinstance(record, ProvenanceRecord):
        return _PROVENANCE.size + 5 * len(record.token_ids)
    if isinstance(record, TextRecord):
        return (
            _TEXT.size
            + _TEXT_TOKEN.size * len(record.tokens)
            + sum(len(t.fragment) for t in record.tokens)
            + len(record.http_delta)
        )
    return _NOTICE.size + len(_notice_message(record))


def split_for_frames(kind: int, records: Sequence[Record]) -> list[list[Record]]:
    """Split records into chunks that each fit one frame (bytes and record count).

    Order is preserved. A single record too large for any frame raises ValueError.
    """
    budget = MAX_FRAME_BYTES - HEADER_SIZE - _COUNT.size
    chunks: list[list[Record]] = []
    current: list[Record] = []
    used = 0
    for record in records:
        size = record_size(kind, record)
        if size > budget:
            raise ValueError(
                f"record for stream {record.stream} is {size} bytes, a frame holds {budget}"
            )
        if current and (used + size > budget or len(current) == MAX_RECORDS):
            chunks.append(current)
            current = []
            used = 0
        current.append(record)
        used += size
    if current:
        chunks.append(current)
    return chunks


# ---------------------------------------------------------------------- steps
# The plugin's hooks hand the emitter one run's records of a step as columns
# (flat lists of ints and strings: nothing the garbage collector tracks is
# allocated per record inside vLLM's loop); the sender thread encodes them.
# A record's bytes are those of the record object with the same fields.
ROW_FLAG_FINISHED = _FLAG_FINISHED
ROW_FLAG_TRIMMED = _FLAG_TRIMMED
ROW_FLAG_TEXT_TRUNCATED = _FLAG_TEXT_TRUNCATED
ROW_FLAG_TOKENS_TRIMMED = _FLAG_TOKENS_TRIMMED
# Ints per record in a step's `meta` column.
ROW_WIDTH = 7

# meta: per record stream, flags, finish_reason, offset, n_tokens,
# drafts_scheduled, drafts_padded; every record's token ids in record order;
# each record's roles (one byte per token).
ProvenanceStep = tuple[list[int], list[int], list[bytes]]
# meta: per record stream, flags, finish_reason, offset, n_tokens, n_fragments,
# trimmed_tokens; token ids; each record's HTTP text; fragments (a record owns
# the next n_fragments, those of its first n_fragments tokens; its other
# tokens' are empty); span_backs of the records that have any (record index ->
# one per token; other records: all 0); optionally (a sixth element) lead_lens
# (record index -> one per token, passed through for every token: the split of
# a fragment with span_back, the give count of an empty fragment). A token of a
# record without lead_lens: 0 with a fragment and no span_back, else LEAD_UNKNOWN.
TextStep = (
    tuple[list[int], list[int], list[str], list[str], dict[int, list[int]]]
    | tuple[list[int], list[int], list[str], list[str], dict[int, list[int]], dict[int, list[int]]]
)

# One precompiled Struct per token count: a provenance record is one pack call.
_PROVENANCE_STRUCTS: dict[int, struct.Struct] = {}


def _provenance_struct(count: int) -> struct.Struct:
    if count > MAX_TOKENS_PER_RECORD:
        raise ValueError(f"{count} tokens, limit {MAX_TOKENS_PER_RECORD}")
    packer = _PROVENANCE_STRUCTS[count] = struct.Struct(f"<HBBIHHH{count}I{count}s")
    return packer


def _check_columns(meta: list[int], ids: list[int], per_record: list[Any], total: int) -> None:
    if len(meta) != ROW_WIDTH * len(per_record) or total != len(ids):
        raise ValueError(
            f"step columns disagree: {len(meta)} meta ints, {len(per_record)} records, "
            f"{len(ids)} ids for {total} tokens"
        )


def encode_provenance_step(step: ProvenanceStep) -> list[bytes]:
    """The bytes of each provenance record of a step, in order (see ProvenanceStep)."""
    meta, ids, roles = step
    structs = _PROVENANCE_STRUCTS
    encoded: list[bytes] = []
    first = 0
    try:
        for record, record_roles in enumerate(roles):
            at = ROW_WIDTH * record
            stream, flags, finish, offset, count, drafts, padded = meta[at : at + ROW_WIDTH]
            if len(record_roles) != count:
                raise ValueError(
                    f"record for stream {stream}: {len(record_roles)} roles for {count} tokens"
                )
            packer = structs.get(count) or _provenance_struct(count)
            encoded.append(packer.pack(stream, flags, finish, offset, count, drafts, padded,
                                       *ids[first : first + count], record_roles))  # fmt: skip
            first += count
    except struct.error as error:
        raise ValueError(f"provenance record field out of range: {error}") from error
    _check_columns(meta, ids, roles, first)
    return encoded


def encode_text_step(step: TextStep) -> list[bytes]:
    """The bytes of each text record of a step, in order (see TextStep)."""
    meta, ids, texts, fragments, span_backs = step[:5]
    leads_of: dict[int, list[int]] = step[5] if len(step) > 5 else {}
    encoded: list[bytes] = []
    first_id = first_fragment = 0
    for record, text in enumerate(texts):
        at = ROW_WIDTH * record
        stream, flags, finish, offset, count, fed, trimmed = meta[at : at + ROW_WIDTH]
        backs = span_backs.get(record)
        leads = leads_of.get(record)
        if leads is not None and len(leads) != count:
            raise ValueError(f"text record: lead_lens for {count} tokens needed")
        tokens = []
        for position in range(count):
            piece = fragments[first_fragment + position].encode("utf-8") if position < fed else b""
            back = backs[position] if backs is not None else 0
            # The hooks' lead_len (attribution.py) as given; without one, a fragment's
            # own bytes need no split and anything else is not known.
            if leads is not None:
                lead = leads[position]
            else:
                lead = 0 if piece and not back else LEAD_UNKNOWN
            tokens.append(TextToken(ids[first_id + position], piece, back, lead))
        first_id += count
        first_fragment += fed
        text_record = TextRecord(
            stream=stream,
            offset=offset,
            tokens=tokens,
            http_delta=text.encode("utf-8"),
            finished=bool(flags & _FLAG_FINISHED),
            finish_reason=finish,
            text_truncated=bool(flags & _FLAG_TEXT_TRUNCATED),
            tokens_trimmed=bool(flags & _FLAG_TOKENS_TRIMMED),
            trimmed_tokens=trimmed,
        )
        encoded.append(encode_record(KIND_TEXT, text_record))
    _check_columns(meta, ids, texts, first_id)
    if first_fragment != len(fragments):
        raise ValueError(f"text step: {first_fragment} fragments owned, {len(fragments)} given")
    return encoded


def encode_rows(kind: int, step: ProvenanceStep | TextStep) -> list[bytes]:
    """The bytes of each record of a provenance or text step."""
    if kind == KIND_PROVENANCE:
        return encode_provenance_step(step)  # type: ignore[arg-type]
    if kind == KIND_TEXT:
        return encode_text_step(step)  # type: ignore[arg-type]
    raise ValueError(f"kind {kind} has no rows")


def encode_record(kind: int, record: Record) -> bytes:
    """The bytes of one record in a frame of the given kind."""
    parts: list[bytes] = []
    try:
        if kind == KIND_PROVENANCE and isinstance(record, ProvenanceRecord):
            _encode_provenance(record, parts)
        elif kind == KIND_TEXT and isinstance(record, TextRecord):
            _encode_text(record, parts)
        elif kind == KIND_NOTICE and isinstance(record, NoticeRecord):
            _encode_notice(record, parts)
        else:
            _wrong_kind(kind, record)
    except struct.error as error:
        raise ValueError(f"{KIND_NAMES[kind]} record field out of range: {error}") from error
    return b"".join(parts)


def encode_frame(kind: int, header: Header, records: Sequence[bytes]) -> bytes:
    """A frame of `kind` holding already encoded records (encode_record / encode_rows)."""
    if not 1 <= len(records) <= MAX_RECORDS:
        raise ValueError(f"{len(records)} records, a frame holds 1..={MAX_RECORDS}")
    if len(header.run_id) != 16:
        raise ValueError(f"run id must be 16 raw bytes, got {len(header.run_id)}")
    body = _COUNT.pack(len(records)) + b"".join(records)
    total = HEADER_SIZE + len(body)
    if total > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {total} bytes exceeds {MAX_FRAME_BYTES}")
    return _header(kind, header, len(body)) + body


def encode_joined_frame(kind: int, header: Header, count: int, body: bytes) -> bytes:
    """encode_frame for records already joined: `body` holds `count` encoded records."""
    if not 1 <= count <= MAX_RECORDS:
        raise ValueError(f"{count} records, a frame holds 1..={MAX_RECORDS}")
    if len(header.run_id) != 16:
        raise ValueError(f"run id must be 16 raw bytes, got {len(header.run_id)}")
    total = HEADER_SIZE + _COUNT.size + len(body)
    if total > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {total} bytes exceeds {MAX_FRAME_BYTES}")
    return b"".join((_header(kind, header, _COUNT.size + len(body)), _COUNT.pack(count), body))


# Room for records in one frame.
FRAME_RECORD_BUDGET = MAX_FRAME_BYTES - HEADER_SIZE - _COUNT.size
