"""What a lying server says during one run, as data: frames, SSE events, pauses.

A `Transcript` is the ordered script the server plays for one run: every
datagram it sends to the client's socket (`Frame`, encoded with the plugin's
own encoder `parallelhue_vllm.wire`, then optionally edited byte by byte where
the encoder refuses a lie) and every SSE event it writes to a stream's body
(`Sse`), with `Pause`s where timing matters. The honest bases (story.py) build
one; a case's mutation (cases.py) changes exactly the fields it lies about,
in place, through the lookup helpers below, so a lie is one readable line.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from parallelhue_vllm import wire

__all__ = [
    "AwaitVerdict",
    "ByteEdit",
    "End",
    "Frame",
    "Offsets",
    "Pause",
    "Sse",
    "Transcript",
    "set_field",
]

ByteEdit = Callable[[bytes], bytes]


@dataclass
class Frame:
    """One datagram: a hello (`hello`) or a record frame (`records`)."""

    source: str  # the sending source's name in Transcript.sources
    kind: int
    seq: int
    step: int
    timestamp_ns: int
    records: list[wire.Record] = field(default_factory=list)
    hello: wire.Hello | None = None
    dropped: int = 0
    run_id: str | None = None  # None: the run's own id
    source_id: int | None = None  # None: the source's id
    edits: list[ByteEdit] = field(default_factory=list)  # applied after encoding, in order

    def encode(self, run_id: str, source_id: int) -> bytes:
        header = wire.Header(
            bytes.fromhex(self.run_id or run_id),
            self.source_id if self.source_id is not None else source_id,
            self.seq,
            self.step,
            self.timestamp_ns,
            self.dropped,
        )
        if self.kind == wire.KIND_HELLO:
            assert self.hello is not None
            data = wire.encode_hello(header, self.hello)
        else:
            data = wire.encode_records(self.kind, header, self.records)
        for edit in self.edits:
            data = edit(data)
        return data


@dataclass
class Sse:
    """One SSE event written to one stream's body.

    `data` is a chunk object (JSON-encoded when played) or a string written as
    the event's data verbatim (for JSON the encoder would not write, e.g. a lone
    surrogate escape); `raw`, when set, replaces the whole event (comments,
    `event:` lines, broken framing).
    """

    stream: int
    data: dict[str, Any] | str | None = None
    raw: bytes | None = None
    step: int | None = None  # the engine step whose output this chunk carries

    def encode(self) -> bytes:
        if self.raw is not None:
            return self.raw
        if isinstance(self.data, dict):
            text = json.dumps(self.data, ensure_ascii=False, separators=(",", ":"))
        else:
            assert self.data is not None
            text = self.data
        return f"data: {text}\n\n".encode()

    @property
    def choice(self) -> dict[str, Any]:
        """The first choice of a chunk object (the one every honest chunk has)."""
        assert isinstance(self.data, dict)
        choice: dict[str, Any] = self.data["choices"][0]
        return choice

    @property
    def is_content(self) -> bool:
        """A chunk with a choice that carries token ids (not the role or usage chunk)."""
        return (
            isinstance(self.data, dict)
            and bool(self.data.get("choices"))
            and "token_ids" in self.data["choices"][0]
        )


@dataclass
class Pause:
    """Wait before the next action (ordering games: evidence after a verdict)."""

    seconds: float


@dataclass
class AwaitVerdict:
    """Wait until the client shows a verdict for `stream` (the harness reports it).

    Makes "evidence after the verdict" deterministic instead of a race with sleeps.
    """

    stream: int
    timeout: float = 10.0


@dataclass
class End:
    """End one stream's body (the chunked terminator); later SSE for it is not sent."""

    stream: int


Action = Frame | Sse | Pause | AwaitVerdict | End


@dataclass
class Transcript:
    """The whole script of one run, and lookups that mutations use."""

    streams: int
    chat: bool
    sources: dict[str, int]  # name -> source_id
    actions: list[Action] = field(default_factory=list)
    max_tokens: int = 64

    # --- lookups ------------------------------------------------------------------

    def frames(self, source: str | None = None, kind: int | None = None) -> list[Frame]:
        return [
            a
            for a in self.actions
            if isinstance(a, Frame)
            and (source is None or a.source == source)
            and (kind is None or a.kind == kind)
        ]

    def hello(self, source: str) -> wire.Hello:
        (frame,) = [f for f in self.frames(source, wire.KIND_HELLO)]
        assert frame.hello is not None
        return frame.hello

    def hello_frame(self, source: str) -> Frame:
        (frame,) = [f for f in self.frames(source, wire.KIND_HELLO)]
        return frame

    def _records(self, kind: int, stream: int) -> Iterator[tuple[Frame, wire.Record]]:
        for frame in self.frames(kind=kind):
            for record in frame.records:
                if record.stream == stream:
                    yield frame, record

    def prov(self, stream: int, index: int) -> wire.ProvenanceRecord:
        """The stream's `index`-th provenance record (negative: from the end)."""
        record = [r for _, r in self._records(wire.KIND_PROVENANCE, stream)][index]
        assert isinstance(record, wire.ProvenanceRecord)
        return record

    def prov_frame(self, stream: int, index: int) -> Frame:
        return [f for f, _ in self._records(wire.KIND_PROVENANCE, stream)][index]

    def text(self, stream: int, index: int) -> wire.TextRecord:
        record = [r for _, r in self._records(wire.KIND_TEXT, stream)][index]
        assert isinstance(record, wire.TextRecord)
        return record

    def text_frame(self, stream: int, index: int) -> Frame:
        return [f for f, _ in self._records(wire.KIND_TEXT, stream)][index]

    def sse(self, stream: int, index: int) -> Sse:
        """The stream's `index`-th content chunk (one with token ids)."""
        return [a for a in self.sse_events(stream) if a.is_content][index]

    def sse_events(self, stream: int) -> list[Sse]:
        return [a for a in self.actions if isinstance(a, Sse) and a.stream == stream]

    def usage_chunk(self, stream: int) -> dict[str, Any]:
        """The stream's final usage chunk (no choices), as JSON data."""
        (event,) = [
            a
            for a in self.sse_events(stream)
            if isinstance(a.data, dict) and "usage" in a.data and not a.data["choices"]
        ]
        assert isinstance(event.data, dict)
        return event.data

    def usage(self, stream: int) -> dict[str, Any]:
        usage: dict[str, Any] = self.usage_chunk(stream)["usage"]
        return usage

    def done(self, stream: int) -> Sse:
        (event,) = [a for a in self.sse_events(stream) if a.data == "[DONE]"]
        return event

    def next_seq(self, source: str) -> int:
        return max(f.seq for f in self.frames(source)) + 1

    def index(self, action: Action) -> int:
        return next(i for i, a in enumerate(self.actions) if a is action)

    def insert_after(self, anchor: Action, *actions: Action) -> None:
        position = self.index(anchor) + 1
        self.actions[position:position] = list(actions)

    def insert_before(self, anchor: Action, *actions: Action) -> None:
        position = self.index(anchor)
        self.actions[position:position] = list(actions)

    def remove(self, action: Action) -> None:
        del self.actions[self.index(action)]

    def insert_frame(self, frame: Frame, *, before: Action) -> Frame:
        """Insert a frame of `frame.source` before `before`, taking the next seq there.

        The source's later frames move up by one, so the sequence stays gapless.
        """
        position = self.index(before)
        earlier = [
            a for a in self.actions[:position] if isinstance(a, Frame) and a.source == frame.source
        ]
        frame.seq = max(f.seq for f in earlier) + 1
        for later in self.actions[position:]:
            if isinstance(later, Frame) and later.source == frame.source:
                later.seq += 1
        self.actions.insert(position, frame)
        return frame

    def remove_frame(self, frame: Frame) -> None:
        """Remove a frame; the source's later frames move down by one (no gap)."""
        position = self.index(frame)
        for later in self.actions[position + 1 :]:
            if isinstance(later, Frame) and later.source == frame.source:
                later.seq -= 1
        del self.actions[position]

    def end_action(self, stream: int) -> End:
        (end,) = [a for a in self.actions if isinstance(a, End) and a.stream == stream]
        return end


# --- byte-level edits of encoded frames ----------------------------------------------

_FORMATS = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}


def set_field(offset: int, size: int, value: int) -> ByteEdit:
    """An edit writing `value` as a little-endian unsigned field at `offset`."""
    fmt = _FORMATS[size]

    def edit(data: bytes) -> bytes:
        return data[:offset] + struct.pack(fmt, value) + data[offset + size :]

    return edit


class Offsets:
    """Byte offsets of fields in encoded frames (docs/PROTOCOL.md layout tables).

    Only the first record of a frame is addressed by offset; the record sizes come
    from the encoder's own structs, so the offsets follow its Offsets.
    """

    MAGIC, VERSION, KIND, FLAGS = 0, 4, 5, 6
    RUN_ID, SOURCE_ID, SEQ, STEP, TIMESTAMP, DROPPED, BODY_LEN = 8, 24, 32, 40, 48, 56, 60
    BODY = wire.HEADER_SIZE
    RECORD = BODY + 2  # after the record count
    # hello body: role, engine, role_derivation, async_scheduling, K, verification, str8s
    HELLO_ROLE, HELLO_ENGINE, HELLO_DERIVATION, HELLO_ASYNC = BODY, BODY + 1, BODY + 2, BODY + 3
    HELLO_K, HELLO_VERIFICATION = BODY + 4, BODY + 6
    # record fields (provenance and text share the first four)
    REC_STREAM, REC_FLAGS, REC_FINISH, REC_OFFSET, REC_COUNT = (
        RECORD,
        RECORD + 2,
        RECORD + 3,
        RECORD + 4,
        RECORD + 8,
    )
    PROV_DRAFTS, PROV_PADDED = RECORD + 10, RECORD + 12
    PROV_IDS = RECORD + wire._PROVENANCE.size
    TEXT_TRIMMED, TEXT_HTTP_LEN = RECORD + 10, RECORD + 12
    TEXT_TOKENS = RECORD + wire._TEXT.size
    TEXT_TOKEN_SIZE = wire._TEXT_TOKEN.size
    # notice record: stream, code, msg_len, msg
    NOTICE_STREAM, NOTICE_CODE, NOTICE_LEN = RECORD, RECORD + 2, RECORD + 4

    @staticmethod
    def text_token(index: int) -> int:
        """Offset of the first record's `index`-th token entry (token_id, frag_len, ...)."""
        return Offsets.TEXT_TOKENS + index * Offsets.TEXT_TOKEN_SIZE
