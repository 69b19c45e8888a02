"""One stream's SSE body, bytes in, the reconciler's SSE inputs out (docs/PROTOCOL.md
"Reading the SSE body").

The reference of the Rust reader's event-stream grammar and fold
(`rust/core/src/sse/events.rs` `EventParser`, `rust/core/src/sse/parser.rs`
`SseParser`, `rust/core/src/http/sse_body.rs` `StreamBody`): the same bytes,
split into reads anywhere, give the same inputs, the same end and the same
finish reason, and the same refusal with the same message (a JSON syntax error
excepted, which each JSON parser words itself; its class, `invalid JSON in SSE
data: `, is the same). `tests/test_sse_body.py` and
the `sse_differential` fuzz target hold the two readers equal.

The body is read as bytes, never as text first: a line is UTF-8 or the stream is
refused (`invalid UTF-8 in SSE line {n}`), so no byte is ever replaced by
U+FFFD on the way to the reconciler. Lines end with CRLF, LF or CR (a CRLF may
be split over two reads); a BOM is dropped at the start of the first line only.
"""

from __future__ import annotations

import re
from typing import Any

from parallelhue.reference.sse import ChunkInputs, Input, SseError
from parallelhue_vllm.inband import EVENT_NAME, STATUS_DROPPED, End, InbandError, decode_event
from parallelhue_vllm.inband import lost_reason as inband_lost_reason

__all__ = [
    "MAX_EVENT_BYTES",
    "MAX_LINE_BYTES",
    "BodyReader",
    "EventStream",
    "differ",
    "read_body",
]

# The Rust reader's bounds (rust/core/src/sse/error.rs).
MAX_LINE_BYTES = 8 << 20
MAX_EVENT_BYTES = 16 << 20
_LINE_END = re.compile(rb"[\r\n]")
# Rust's `str::trim`: the Unicode White_Space characters (not Python's isspace set).
WHITE_SPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)

# An event-stream result: ("event", type, data) or ("error", message).
Raw = tuple[str, ...]


class EventStream:
    """The WHATWG event-stream grammar over bytes, as the Rust `EventParser` reads it."""

    def __init__(self) -> None:
        self._line = bytearray()
        self._after_cr = False  # the previous read ended with CR: a leading LF ends that line
        self._skipping = False  # discarding the rest of an over-long line
        self._started = False
        self._line_no = 0
        self._data: list[str] = []
        self._data_len = 0  # UTF-8 bytes of the data so far, a newline after each line
        self._has_data = False
        self._too_large = False
        self._event = ""

    def feed(self, data: bytes) -> list[Raw]:
        out: list[Raw] = []
        pos, size = 0, len(data)
        if self._after_cr:
            self._after_cr = False
            if size and data[0] == 0x0A:
                pos = 1
        while pos < size:
            match = _LINE_END.search(data, pos)
            if match is None:
                self._push(data[pos:], out)
                break
            end = match.start()
            if not self._line and not self._skipping and end - pos <= MAX_LINE_BYTES:
                self._line_no += 1
                self._parse_line(data[pos:end], out)
            else:
                self._push(data[pos:end], out)
                self._end_line(out)
            if data[end] == 0x0D:
                if end + 1 < size:
                    pos = end + 2 if data[end + 1] == 0x0A else end + 1
                else:
                    self._after_cr = True
                    pos = size
            else:
                pos = end + 1
        return out

    def finish(self) -> list[Raw]:
        """The stream ended: an event without its blank line is an error (and discarded)."""
        out: list[Raw] = []
        if self._line or self._skipping:
            self._end_line(out)
        if self._has_data:
            out.append(("error", "SSE stream ended inside an event (no blank line after its data)"))
        self._reset_event()
        return out

    def _push(self, data: bytes, out: list[Raw]) -> None:
        if self._skipping:
            return
        if len(self._line) + len(data) > MAX_LINE_BYTES:
            self._line.clear()
            self._skipping = True
            out.append(
                ("error", f"SSE line {self._line_no + 1} longer than {MAX_LINE_BYTES} bytes")
            )
            return
        self._line += data

    def _end_line(self, out: list[Raw]) -> None:
        self._line_no += 1
        if self._skipping:
            self._skipping = False
            self._line.clear()
            return
        line = bytes(self._line)
        self._line.clear()
        self._parse_line(line, out)

    def _parse_line(self, line: bytes, out: list[Raw]) -> None:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            out.append(("error", f"invalid UTF-8 in SSE line {self._line_no}"))
            return
        if not self._started:
            self._started = True
            text = text.removeprefix("\ufeff")
        if not text:
            self._dispatch(out)
            return
        if text.startswith(":"):
            return  # a comment
        field, colon, value = text.partition(":")
        if colon:
            value = value.removeprefix(" ")
        if field == "data":
            size = len(value.encode("utf-8"))
            if self._data_len + size + 1 > MAX_EVENT_BYTES:
                self._too_large = True
            else:
                self._data.append(value)
                self._data_len += size + 1
            self._has_data = True
        elif field == "event":
            self._event = value
        # `id`, `retry` and any other field carry nothing the reader uses.

    def _dispatch(self, out: list[Raw]) -> None:
        if self._too_large:
            out.append(
                (
                    "error",
                    f"SSE event ending at line {self._line_no} has more than "
                    f"{MAX_EVENT_BYTES} data bytes",
                )
            )
        elif self._has_data:
            out.append(("event", self._event, "\n".join(self._data)))
        self._reset_event()

    def _reset_event(self) -> None:
        self._data = []
        self._data_len = 0
        self._has_data = False
        self._too_large = False
        self._event = ""


class BodyReader:
    """One stream's body after the HTTP framing: the events' chunks, extracted, until
    `[DONE]`, the body's end or the first refusal (the Rust `StreamBody` fold).

    `end` is None while the body goes on, then ("done",), ("body_ended",) or
    ("bad_event", message); after it, input is ignored."""

    def __init__(self) -> None:
        self._events = EventStream()
        self.extraction = ChunkInputs()
        self.end: tuple[str, ...] | None = None
        self.inband = InbandState()

    @property
    def finish_reason(self) -> str | None:
        return self.extraction.finish_reason

    def feed(self, data: bytes) -> list[Input]:
        """Bytes of the body: the inputs the events they complete hold, in order."""
        if self.end is not None:
            return []
        out: list[Input] = []
        for raw in self._events.feed(data):
            self._apply(raw, out)
        return out

    def finish(self) -> list[Input]:
        """The body ended: a last event without its blank line still counts."""
        if self.end is not None:
            return []
        out: list[Input] = []
        for raw in [*self._events.feed(b"\n\n"), *self._events.finish()]:
            self._apply(raw, out)
        if self.end is None:
            self.inband.body_ended(out)
            self.end = ("body_ended",)
        return out

    def _apply(self, raw: Raw, out: list[Input]) -> None:
        if self.end is not None:
            return
        if raw[0] == "error":
            self.end = ("bad_event", raw[1])
            return
        _, event_type, data = raw
        if event_type == EVENT_NAME:
            # In-band telemetry: the response's own frames (docs/PROTOCOL.md).
            try:
                self.inband.event(data, out)
            except InbandError as error:
                self.end = ("bad_event", str(error))
            return
        if event_type not in ("", "message"):
            return  # an event with another type is not a completion chunk
        if data.strip(WHITE_SPACE) == "[DONE]":
            self.inband.body_ended(out)
            self.end = ("done",)
            return
        try:
            out.extend(self.extraction.extract_payload(data))
        except SseError as error:
            self.end = ("bad_event", str(error))


ENDED_EARLY = "telemetry lost: the response ended before its in-band telemetry did"


class InbandState:
    """Where a response's in-band telemetry stands (the Rust `inband::InbandState`):
    each event's frames become ("frame", bytes) inputs; an end item that says
    something is missing, or a body that ends with telemetry begun and never
    ended, becomes ("lost", reason)."""

    def __init__(self) -> None:
        self.seen = False
        self.ended = False
        self.frames = 0
        self.end: End | None = None  # the end item (its waited_us: a measurement only)

    def event(self, data: str, out: list[Input]) -> None:
        if self.ended:
            raise InbandError("in-band telemetry: an event after its end item")
        self.seen = True
        for item in decode_event(data):
            if self.ended:
                raise InbandError("in-band telemetry: an event after its end item")
            if isinstance(item, bytes):
                self.frames += 1
                out.append(("frame", item))
                continue
            if item.frames != self.frames:
                raise InbandError(
                    f"in-band telemetry: the end item counts {item.frames} frames, "
                    f"{self.frames} came"
                )
            if (item.status == STATUS_DROPPED) != (item.dropped > 0):
                raise InbandError(
                    f"in-band telemetry: end item status {item.status} with {item.dropped} "
                    "frames dropped"
                )
            self.ended = True
            self.end = item
            reason = inband_lost_reason(item)
            if reason is not None:
                out.append(("lost", reason))

    def body_ended(self, out: list[Input]) -> None:
        if self.seen and not self.ended:
            self.ended = True
            out.append(("lost", ENDED_EARLY))


def read_body(parts: list[bytes]) -> tuple[list[Input], tuple[str, ...], str | None]:
    """A whole body read in `parts`: its inputs, its end and choice 0's finish reason
    (what `parallelhue._native.read_sse_body` gives for the Rust reader)."""
    reader = BodyReader()
    inputs: list[Any] = []
    for part in parts:
        inputs += reader.feed(part)
    inputs += reader.finish()
    assert reader.end is not None
    return inputs, reader.end, reader.finish_reason


JSON_ERROR = "invalid JSON in SSE data: "


def differ(
    a: tuple[list[Input], tuple[str, ...], str | None],
    b: tuple[list[Input], tuple[str, ...], str | None],
) -> str | None:
    """Where two readers' results of one body disagree (None: they agree): the
    inputs, the end and the finish reason must be equal, except that a JSON syntax
    error is compared by its class (each JSON parser words its own)."""
    (inputs_a, end_a, reason_a), (inputs_b, end_b, reason_b) = a, b
    if [tuple(i) for i in inputs_a] != [tuple(i) for i in inputs_b]:
        return f"inputs differ: {inputs_a!r} vs {inputs_b!r}"
    if reason_a != reason_b:
        return f"finish reasons differ: {reason_a!r} vs {reason_b!r}"
    ends = (tuple(end_a), tuple(end_b))
    if ends[0] == ends[1]:
        return None
    json_errors = [e[0] == "bad_event" and e[1].startswith(JSON_ERROR) for e in ends]
    if all(json_errors):
        return None
    return f"ends differ: {ends[0]!r} vs {ends[1]!r}"
