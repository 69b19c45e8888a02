"""Plain-Python decoder for ParallelHue telemetry frames (docs/PROTOCOL.md).

The reference implementation: written to be read next to the protocol tables,
checking fields in layout order so that the first violation found is the one
reported, with exactly the protocol's error messages.

Reading granularity (which matters for `truncated {kind} body at byte {pos}`):
every row of a layout table is one read, arrays included (the 4·n token ids,
the n roles, the 9·n token entries, all fragments together, the HTTP delta, a
str8's length byte and then its bytes). `pos` is the datagram offset at which
the read that could not be completed starts.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from parallelhue_vllm.wire import (
    ALL_STREAMS,
    HEADER_SIZE,
    KIND_HELLO,
    KIND_NAMES,
    KIND_PROVENANCE,
    KIND_TEXT,
    LEAD_UNKNOWN,
    MAGIC,
    MAX_FRAME_BYTES,
    MAX_NOTICE_BYTES,
    MAX_RECORDS,
    MAX_TOKENS_PER_RECORD,
    PROTOCOL_VERSION,
    ROLE_ACCEPTED,
    ROLE_BONUS,
    ROLE_PLAIN,
    ROLE_TARGET,
    SOURCE_FRONTEND,
    VERIFICATION_UNKNOWN,
    Header,
    Hello,
    NoticeRecord,
    ProvenanceRecord,
    Record,
    TextRecord,
    TextToken,
)

ROLE_LETTERS = {ROLE_PLAIN: "P", ROLE_ACCEPTED: "A", ROLE_TARGET: "T", ROLE_BONUS: "B"}
U32_MAX = 0xFFFFFFFF

_HEADER = struct.Struct("<4sBBH16sQQQQII")


class FrameError(ValueError):
    """A datagram that is not a valid protocol-3 frame; str() is the protocol's message."""


@dataclass(slots=True)
class Frame:
    kind: int
    header: Header
    hello: Hello | None = None
    records: list[Record] = field(default_factory=list)
    # Raw record flag bytes, kept for the vectors' decoded meaning.
    record_flags: list[int] = field(default_factory=list)


class _Reader:
    """A cursor over the datagram; positions are datagram offsets."""

    def __init__(self, data: bytes, kind_name: str) -> None:
        self.data = data
        self.pos = HEADER_SIZE
        self.kind_name = kind_name

    def take(self, size: int) -> bytes:
        end = self.pos + size
        if end > len(self.data):
            raise FrameError(f"truncated {self.kind_name} body at byte {self.pos}")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self.take(2), "little")

    def u32(self) -> int:
        return int.from_bytes(self.take(4), "little")

    def finish(self) -> None:
        left = len(self.data) - self.pos
        if left:
            raise FrameError(f"{left} trailing bytes after {self.kind_name} body")


def _decode_header(data: bytes) -> tuple[int, Header]:
    length = len(data)
    if length < HEADER_SIZE:
        raise FrameError(f"truncated frame: {length} bytes, header needs 64")
    if length > MAX_FRAME_BYTES:
        raise FrameError(f"oversized frame: {length} bytes, limit 65536")
    (
        magic,
        version,
        kind,
        flags,
        run_id,
        source_id,
        seq,
        step,
        timestamp_ns,
        dropped,
        body_len,
    ) = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise FrameError(f"bad magic: expected 50485545, got {magic.hex()}")
    if version != PROTOCOL_VERSION:
        raise FrameError(
            f"unsupported protocol version {version} (this build speaks {PROTOCOL_VERSION})"
        )
    if kind not in KIND_NAMES:
        raise FrameError(f"unknown frame kind {kind}")
    if flags != 0:
        raise FrameError(f"reserved header flags set: {flags}")
    if source_id == 0:
        raise FrameError("source id 0 is reserved")
    if body_len != length - HEADER_SIZE:
        raise FrameError(
            f"body length mismatch: header says {body_len}, datagram has {length - HEADER_SIZE}"
        )
    return kind, Header(run_id, source_id, seq, step, timestamp_ns, dropped)


def _str8(reader: _Reader, name: str) -> str:
    raw = reader.take(reader.u8())
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise FrameError(f"hello: invalid UTF-8 in {name}") from None


def _decode_hello(reader: _Reader) -> Hello:
    role = reader.u8()
    if role not in (1, 2):
        raise FrameError(f"hello: unknown role {role}")
    engine = reader.u8()
    if engine not in (1, 2):
        raise FrameError(f"hello: unknown engine {engine}")
    derivation = reader.u8()
    if derivation not in (0, 1, 2):
        raise FrameError(f"hello: unknown role derivation {derivation}")
    async_scheduling = reader.u8()
    # Not in the protocol's error table; the layout says "0 or 1".
    if async_scheduling not in (0, 1):
        raise FrameError(f"hello: invalid async_scheduling {async_scheduling}")
    num_speculative_tokens = reader.u16()
    # A step of K accepted drafts and a bonus token must fit one record.
    if num_speculative_tokens > MAX_TOKENS_PER_RECORD - 1:
        raise FrameError(
            f"hello: num_speculative_tokens {num_speculative_tokens} exceeds 255 "
            "(a step of K + 1 tokens must fit one record)"
        )
    verification = reader.u16()
    if verification > VERIFICATION_UNKNOWN:
        raise FrameError(f"hello: unknown verification {verification}")
    plugin_version = _str8(reader, "plugin_version")
    engine_version = _str8(reader, "engine_version")
    spec_method = _str8(reader, "spec_method")
    no_method = spec_method == ""
    if (
        (derivation == 0) != no_method
        or (num_speculative_tokens == 0) != no_method
        or (verification == 0) != no_method
    ):
        raise FrameError(
            f"hello: inconsistent speculative fields (method '{spec_method}', "
            f"K {num_speculative_tokens}, derivation {derivation}, verification {verification})"
        )
    # Draft ids are only seen without async scheduling; under it only counts.
    if (derivation == 1 and async_scheduling == 1) or (derivation == 2 and async_scheduling == 0):
        raise FrameError(
            f"hello: role derivation {derivation} with async_scheduling {async_scheduling}"
        )
    # The frontend does not schedule: it has no speculative fields to announce.
    if role == SOURCE_FRONTEND and (derivation != 0 or async_scheduling != 0):
        raise FrameError(
            f"hello: frontend hello with speculative fields (method '{spec_method}', "
            f"K {num_speculative_tokens}, derivation {derivation}, "
            f"async_scheduling {async_scheduling}, verification {verification})"
        )
    reader.finish()
    return Hello(
        role,
        engine,
        derivation,
        async_scheduling == 1,
        num_speculative_tokens,
        plugin_version,
        engine_version,
        spec_method,
        verification,
    )


def _record_count(reader: _Reader) -> int:
    count = reader.u16()
    if not 1 <= count <= MAX_RECORDS:
        raise FrameError(f"record count {count} out of range 1..=1024")
    return count


def _check_stream(stream: int, seen: set[int]) -> None:
    if stream in seen:
        raise FrameError(f"stream {stream} appears twice in one frame")
    if stream == ALL_STREAMS:
        raise FrameError("stream 65535 is reserved")
    seen.add(stream)


def _check_finish(stream: int, finished: bool, reason: int) -> None:
    valid = 1 <= reason <= 4 if finished else reason == 0
    if not valid:
        raise FrameError(
            f"record for stream {stream}: finish reason {reason} with finished={int(finished)}"
        )


def _check_token_range(stream: int, offset: int, count: int, lowest: int) -> None:
    if not lowest <= count <= MAX_TOKENS_PER_RECORD:
        raise FrameError(f"record for stream {stream}: {count} tokens out of range {lowest}..=256")
    if offset + count > U32_MAX:
        raise FrameError(
            f"record for stream {stream}: offset {offset} + {count} tokens overflows u32"
        )


def _check_roles(stream: int, roles: bytes, drafts_scheduled: int, trimmed: bool) -> None:
    for index, role in enumerate(roles):
        if role not in ROLE_LETTERS:
            raise FrameError(f"record for stream {stream}: unknown role {role} at token {index}")
    letters = "".join(ROLE_LETTERS[role] for role in roles)
    if drafts_scheduled == 0:
        valid = letters == "P"
    else:
        accepted = len(letters) - len(letters.lstrip("A"))
        tail = letters[accepted:]
        if tail == "":
            valid = trimmed and accepted <= drafts_scheduled
        elif tail == "B":
            valid = accepted == drafts_scheduled
        elif tail == "T":
            valid = accepted < drafts_scheduled
        else:
            valid = False
    if not valid:
        raise FrameError(f"record for stream {stream}: invalid role sequence {letters}")


def _decode_provenance(reader: _Reader, frame: Frame) -> None:
    seen: set[int] = set()
    for _ in range(_record_count(reader)):
        stream = reader.u16()
        _check_stream(stream, seen)
        flags = reader.u8()
        if flags & ~0b11:
            raise FrameError(f"record for stream {stream}: invalid flags {flags}")
        finished = bool(flags & 1)
        finish_reason = reader.u8()
        _check_finish(stream, finished, finish_reason)
        offset = reader.u32()
        count = reader.u16()
        _check_token_range(stream, offset, count, 1)
        drafts_scheduled = reader.u16()
        drafts_padded = reader.u16()
        if drafts_padded > drafts_scheduled:
            raise FrameError(
                f"record for stream {stream}: {drafts_padded} padded drafts exceed "
                f"{drafts_scheduled} scheduled"
            )
        token_ids = list(struct.unpack(f"<{count}I", reader.take(4 * count)))
        roles = reader.take(count)
        trimmed = bool(flags & 2)
        _check_roles(stream, roles, drafts_scheduled, trimmed)
        accepted = roles.count(ROLE_ACCEPTED)
        # A padded draft slot held no draft: it cannot have been accepted.
        if accepted > drafts_scheduled - drafts_padded:
            raise FrameError(
                f"record for stream {stream}: {accepted} accepted drafts exceed "
                f"{drafts_scheduled} scheduled minus {drafts_padded} padded"
            )
        frame.records.append(
            ProvenanceRecord(
                stream,
                offset,
                token_ids,
                list(roles),
                drafts_scheduled,
                drafts_padded,
                finished,
                finish_reason,
                trimmed,
            )
        )
        frame.record_flags.append(flags)
    reader.finish()


def _utf8_ok(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _decode_text(reader: _Reader, frame: Frame) -> None:
    seen: set[int] = set()
    for _ in range(_record_count(reader)):
        stream = reader.u16()
        _check_stream(stream, seen)
        flags = reader.u8()
        finished = bool(flags & 1)
        if flags & ~0b111 or (flags & 0b110 and not finished):
            raise FrameError(f"record for stream {stream}: invalid flags {flags}")
        finish_reason = reader.u8()
        _check_finish(stream, finished, finish_reason)
        # text_truncated and tokens_trimmed both say a stop string ended the request.
        if flags & 0b110 and finish_reason != 1:
            raise FrameError(
                f"record for stream {stream}: stop-string flags {flags} "
                f"with finish reason {finish_reason}"
            )
        offset = reader.u32()
        count = reader.u16()
        _check_token_range(stream, offset, count, 0 if finished else 1)
        trimmed_tokens = reader.u16()
        if trimmed_tokens and not flags & 4:
            raise FrameError(
                f"record for stream {stream}: trimmed_tokens {trimmed_tokens} "
                "without tokens_trimmed flag"
            )
        http_len = reader.u32()
        entries = list(struct.iter_unpack("<IHBH", reader.take(9 * count)))
        for index, (_, frag_len, span_back, lead_len) in enumerate(entries):
            _check_token_entry(stream, index, frag_len, span_back, lead_len)
        fragments_blob = reader.take(sum(entry[1] for entry in entries))
        tokens: list[TextToken] = []
        start = 0
        for index, (token_id, frag_len, span_back, lead_len) in enumerate(entries):
            fragment = fragments_blob[start : start + frag_len]
            start += frag_len
            if not _utf8_ok(fragment):
                raise FrameError(
                    f"record for stream {stream}: invalid UTF-8 in fragment of token {index}"
                )
            tokens.append(TextToken(token_id, fragment, span_back, lead_len))
        http_delta = reader.take(http_len)
        if not _utf8_ok(http_delta):
            raise FrameError(f"record for stream {stream}: invalid UTF-8 in http delta")
        frame.records.append(
            TextRecord(
                stream,
                offset,
                tokens,
                http_delta,
                finished,
                finish_reason,
                bool(flags & 2),
                bool(flags & 4),
                trimmed_tokens,
            )
        )
        frame.record_flags.append(flags)
    reader.finish()


def _check_token_entry(
    stream: int, index: int, frag_len: int, span_back: int, lead_len: int
) -> None:
    if frag_len == 0:
        # An empty fragment claims nothing; its lead_len is its give count (any value).
        if span_back != 0:
            raise FrameError(
                f"record for stream {stream}: span_back {span_back} on empty fragment "
                f"at token {index}"
            )
        return
    if span_back == 0 and lead_len != 0:
        raise FrameError(
            f"record for stream {stream}: lead_len {lead_len} without span_back at token {index}"
        )
    if lead_len != LEAD_UNKNOWN and lead_len > frag_len:
        raise FrameError(
            f"record for stream {stream}: lead_len {lead_len} exceeds the {frag_len}-byte "
            f"fragment at token {index}"
        )


def _decode_notice(reader: _Reader, frame: Frame) -> None:
    for _ in range(_record_count(reader)):
        stream = reader.u16()
        code = reader.u16()
        length = reader.u16()
        if length > MAX_NOTICE_BYTES:
            raise FrameError(f"notice for stream {stream}: message of {length} bytes exceeds 1024")
        raw = reader.take(length)
        try:
            message = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise FrameError(f"notice for stream {stream}: invalid UTF-8 message") from None
        frame.records.append(NoticeRecord(stream, code, message))
        frame.record_flags.append(0)
    reader.finish()


def decode_frame(data: bytes) -> Frame:
    """Decode one datagram; raise FrameError with the protocol's message if invalid."""
    data = bytes(data)
    kind, header = _decode_header(data)
    frame = Frame(kind, header)
    reader = _Reader(data, KIND_NAMES[kind])
    if kind == KIND_HELLO:
        frame.hello = _decode_hello(reader)
    elif kind == KIND_PROVENANCE:
        _decode_provenance(reader, frame)
    elif kind == KIND_TEXT:
        _decode_text(reader, frame)
    else:
        _decode_notice(reader, frame)
    return frame


def frame_meaning(frame: Frame) -> dict[str, Any]:
    """The decoded meaning of a frame in the test vectors' JSON shape."""
    header = frame.header
    meaning: dict[str, Any] = {
        "kind": KIND_NAMES[frame.kind],
        "run_id": header.run_id.hex(),
        "source_id": header.source_id,
        "seq": header.seq,
        "step": header.step,
        "timestamp_ns": header.timestamp_ns,
        "dropped": header.dropped,
    }
    if frame.hello is not None:
        hello = frame.hello
        meaning["hello"] = {
            "role": hello.role,
            "engine": hello.engine,
            "role_derivation": hello.role_derivation,
            "async_scheduling": hello.async_scheduling,
            "num_speculative_tokens": hello.num_speculative_tokens,
            "plugin_version": hello.plugin_version,
            "engine_version": hello.engine_version,
            "spec_method": hello.spec_method,
            "verification": hello.verification,
        }
        return meaning
    records: list[dict[str, Any]] = []
    for record, flags in zip(frame.records, frame.record_flags, strict=True):
        if isinstance(record, ProvenanceRecord):
            records.append(
                {
                    "stream": record.stream,
                    "flags": flags,
                    "finish_reason": record.finish_reason,
                    "offset": record.offset,
                    "token_ids": list(record.token_ids),
                    "roles": list(record.roles),
                    "drafts_scheduled": record.drafts_scheduled,
                    "drafts_padded": record.drafts_padded,
                }
            )
        elif isinstance(record, TextRecord):
            records.append(
                {
                    "stream": record.stream,
                    "flags": flags,
                    "finish_reason": record.finish_reason,
                    "offset": record.offset,
                    "trimmed_tokens": record.trimmed_tokens,
                    "tokens": [
                        [token.token_id, token.fragment.hex(), token.span_back, token.lead_len]
                        for token in record.tokens
                    ],
                    "http_delta_hex": record.http_delta.hex(),
                }
            )
        else:
            records.append(
                {"stream": record.stream, "code": record.code, "message": record.message}
            )
    meaning["records"] = records
    return meaning


def decode_to_dict(data: bytes) -> dict[str, Any]:
    """decode_frame then frame_meaning: the shape `parallelhue._native.decode_frame` returns."""
    return frame_meaning(decode_frame(data))
