"""Type stubs of `parallelhue._native`, the PyO3 bindings of the Rust core (rust/py).

Checked against the built module by `python -m mypy.stubtest parallelhue._native`
(`make lint`). The `Reconciler` API is exactly the one of docs/PROTOCOL.md
("Python-facing API"), shared with `parallelhue.reference.Reconciler` (typed
like `parallelhue.ingest.reconciler.ReconcilerLike`); the dicts and events it hands
out are the shapes of `parallelhue.model.shapes`, whose keys the constants below
list (tests/test_native_types.py holds them equal).

`decode_frame`, `sse_inputs`, `read_sse_body` and `pack_inputs` are the test
kit (rust/py feature `testkit`): in the development build only (`make
native`); the shipped extension (`make dist`, `pip install .`) has none of them.
"""

import os
from collections.abc import Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, final

from parallelhue.model.shapes import (
    Counters,
    EndKind,
    Event,
    ReceiverStats,
    SourceInfo,
    StreamStats,
    TelemetryState,
    Usage,
)

__all__ = [
    "COUNTER_KEYS",
    "END_KINDS",
    "ERROR_BODY_LIMIT",
    "MAX_FRAME_BYTES",
    "NO_ROLE",
    "NO_STEP",
    "PROTOCOL_VERSION",
    "RECEIVER_KEYS",
    "RECORDING_VERSION",
    "REORDER_WINDOW",
    "SOURCE_KEYS",
    "SPAN_RECORD_BYTES",
    "SSE_COALESCE_STREAMS",
    "SSE_READ_INTERVAL",
    "STAT_KEYS",
    "TELEMETRY_CONTENT_TYPE",
    "HttpStreams",
    "Receiver",
    "Reconciler",
    "RecordWriter",
    "SpanRecords",
    "decode_frame",
    "decode_recording",
    "encode_recording",
    "pack_inputs",
    "read_sse_body",
    "sse_inputs",
    "tail_pieces",
]

PROTOCOL_VERSION: int
MAX_FRAME_BYTES: int
REORDER_WINDOW: int
RECORDING_VERSION: int
STAT_KEYS: list[str]
COUNTER_KEYS: list[str]
SOURCE_KEYS: list[str]
RECEIVER_KEYS: list[str]
END_KINDS: list[str]
# A span record (SpanRecords, Reconciler.take): its bytes, the step of a mixed
# span, the role of a span without one (parallelhue.model.state takes them from here).
SPAN_RECORD_BYTES: int
NO_STEP: int
NO_ROLE: int
SSE_READ_INTERVAL: float  # seconds; HttpStreams' default min_interval (Unix only)
SSE_COALESCE_STREAMS: int  # open connections from which rounds are spaced (Unix only)
ERROR_BODY_LIMIT: int  # bytes of an error body kept for its message (Unix only)
TELEMETRY_CONTENT_TYPE: str  # of a telemetry stream response (Unix only)

# Reconciler.take(): (stream, new SSE text as UTF-8, where each non-empty delta
# ends (u64 LE byte offsets from the stream's start), one arrival time per
# delta (f64 LE, time.monotonic's clock), tokens)
# (delta ends u64, delta token counts u32, counts inputs 5 x i64, [(accepted, drafted)]):
# the server-reported tier's inputs (rust/core/src/fed.rs StreamText).
_Reported = tuple[bytes, bytes, bytes, list[tuple[list[int] | None, list[int] | None]]]
_Text = tuple[int, bytes, bytes, bytes, int, _Reported]
# (stream, end kind or None for a normal finish, HTTP status, detail,
#  finish_reason, usage, monotonic time)
_Ended = tuple[int, EndKind | None, int, str, str | None, Usage | None, float]

@final
class SpanRecords:
    """One stream's proven spans, two u64 words a span: the end offset into
    the stream's SSE text, then step | role << 32 (step NO_STEP: a mixed
    span; role NO_ROLE: none). Grows by doubling; `Reconciler.take` appends to
    it without a Python call. No buffer protocol (`tail_pieces` reads it
    in place)."""

    def __init__(self) -> None: ...
    def __len__(self) -> int:
        """Words (two a span)."""
    def __getitem__(self, index: int, /) -> int: ...
    def __setitem__(self, index: int, word: int, /) -> None: ...
    def __iter__(self) -> Iterator[int]: ...
    def __eq__(self, other: object, /) -> bool: ...
    def extend(self, words: Iterable[int]) -> None:
        """Append words, as array.extend."""
    def frombytes(self, data: bytes) -> None:
        """Append packed spans (16 bytes each, little-endian); ValueError
        "span records come in 16-byte spans; got N bytes" otherwise."""
    def tobytes(self) -> bytes: ...
    def tolist(self) -> list[int]: ...
    @property
    def has_roles(self) -> bool:
        """A span carried a token role (contract C2)."""

@final
class Reconciler:
    """The three-witness reconciler of one run (docs/PROTOCOL.md "Reconciliation").

    Raises ValueError with the protocol's messages for an invalid run id,
    num_streams, stream index or token id. With `packed_spans`, spans reach
    the caller only through take() (packed, never built as span events with
    their text): drain() then returns every other event and no span; take()
    returns the same as without it.
    """

    def __new__(
        cls, run_id: str, num_streams: int, *, packed_spans: bool = False
    ) -> Reconciler: ...
    def push_frame(self, frame: bytes) -> None:
        """One datagram (already uid-checked)."""
    def push_frames(self, frames: list[bytes]) -> None:
        """Several datagrams, in order; the GIL is released meanwhile."""
    def push_inputs(self, inputs: list[tuple[Any, ...]]) -> None:
        """Several inputs, in order, exactly as the single calls: ("frame", bytes),
        ("sse", stream, text, token_ids), ("sse_id", stream, id), ("sse_choice",
        stream, index), ("sse_usage", stream, completion_tokens, per_step_accepted,
        per_step_drafted) or ("finish", stream, finish_reason). Converted while
        holding the GIL, pushed with it released; a bad item raises the single
        call's error (or ValueError "invalid input ...") after the items before it."""
    def push_sse(self, stream: int, text: str, token_ids: list[int]) -> None:
        """One SSE delta of one stream: choice 0's text and its token_ids."""
    def push_sse_id(self, stream: int, chunk_id: str) -> None:
        """The SSE chunk `id`: pushed for the first chunk and whenever it changes."""
    def push_sse_choice(self, stream: int, index: int) -> None:
        """Pushed once: a chunk carried a choice other than one choice with index 0."""
    def push_sse_usage(
        self,
        stream: int,
        completion_tokens: int | None,
        per_step_accepted: list[int] | None,
        per_step_drafted: list[int] | None,
    ) -> None:
        """The usage chunk: `usage.completion_tokens` and vLLM's per-request metrics
        (`metrics.speculative_decoding.per_step_accepted` / `per_step_drafted`)."""
    def push_lost(self, frames: int | None) -> None:
        """Telemetry lost on the way: `frames` the server's hub dropped, None an
        unknown number (its stream ended before the run). Every stream without
        a final verdict fails, an exact one too (docs/PROTOCOL.md, "Lost telemetry")."""
    def push_stream_lost(self, stream: int, reason: str) -> None:
        """A stream's in-band telemetry is missing frames: that stream fails with
        `reason` (docs/PROTOCOL.md, "In-band telemetry")."""
    def finish_sse(self, stream: int, finish_reason: str | None) -> None:
        """The stream's SSE ended normally; `finish_reason` is its choice 0's
        finish_reason (a chunk may repeat it, never change it)."""
    def finalize(self) -> None:
        """Every stream that is neither exact nor failed gets its verdict; from now
        on every verdict is final and frames are only counted (late_frames)."""
    def drain(self) -> list[Event]:
        """The events since the previous call (spans carry the role, shapes.SpanEvent;
        an exact verdict can be revoked by a later failed event before finalize())."""
    def stream_stats(self, stream: int) -> StreamStats: ...
    def totals(self) -> StreamStats:
        """`stream_stats` summed over the streams."""
    def counters(self) -> Counters: ...
    def sources(self) -> list[SourceInfo]:
        """One per hello seen."""
    def verdict(self, stream: int) -> tuple[str, str | None]:
        """("pending" | "exact" | "failed", the failure reason or None); final once
        finalize() ran."""
    # display.rs
    def take(
        self, span_records: Sequence[SpanRecords]
    ) -> tuple[list[_Text], list[Event], list[_Ended]]:
        """Since the last call, for the screen: new SSE text per stream (from
        HttpStreams), every other event in order, and the streams whose
        exchange ended; each stream's new spans over its text are appended to
        `span_records[stream]` (one per stream: ValueError for another count,
        TypeError for another type, both before anything is taken)."""
    def push_recorded(self, data: bytes) -> None:
        """Apply a buffer of recording items (no preamble) in order, the GIL
        released; ValueError at an invalid item, after the items before it."""
    def record(self, path: str | os.PathLike[str], header: str) -> None:
        """Record every input from now on to `path` after `header` (JSON); OSError."""
    def close_record(self, footer: str | None = None) -> None:
        """Write the footer (None: interrupted run) and finish the file; OSError."""
    @property
    def recording(self) -> bool: ...

def decode_frame(frame: bytes | bytearray) -> dict[str, Any]:
    """Decode one datagram into the decoded-meaning dict of tests/vectors/*.json.

    Raises ValueError with the protocol's exact decoder message. Test kit only.
    """

def decode_recording(data: bytes) -> tuple[str, list[tuple[Any, ...]], str | None]:
    """(header JSON, items, footer JSON or None) of a decompressed recording;
    items are (time, kind, ...): ("start", s), ("sse", s, text, ids),
    ("sse_id", s, id), ("sse_choice", s, index), ("sse_usage", s,
    completion_tokens, per_step_accepted, per_step_drafted), ("finish", s, reason),
    ("end", s, kind, status, detail), ("frame", bytes), ("reject", reason),
    ("lost", frames or None), ("finalize",). ValueError names what is wrong."""

def encode_recording(header: str, items: Any, footer: str | None = None) -> bytes:
    """The uncompressed bytes of a recording of `items` (decode_recording's form)."""

def pack_inputs(inputs: Any) -> bytes:
    """push_inputs' items as one push_recorded buffer. Test kit only."""

def tail_pieces(
    data: bytes | bytearray,
    records: Any,
    limit: int,
    total: int,
    keys: tuple[str, ...] | None,
    by_role: bool,
    other: str,
) -> list[tuple[str, str | None]]:
    """The last spans of a stream (`records`: a SpanRecords or any u64 buffer
    such as an array("Q"), two words a span as in SpanRecords)
    holding at least `limit - total` characters (all for limit < 0), each
    decoded as bytes.decode("utf-8", "replace") does, as (text, key) in text
    order. Keys: None without `keys`; by role keys[role byte] (256 keys); by
    step keys[step % len(keys)], `other` for a span of several steps.
    ValueError for a span outside `data` or a wrong number of keys."""

def sse_inputs(payloads: list[bytes]) -> list[tuple[Any, ...]]:
    """The Rust extraction of one stream's SSE events (each an event's data, as
    the reader's event-stream parser dispatches it): per event, (inputs, choice
    0's finish_reason so far), the inputs C2 tuples without the stream (as
    `parallelhue.reference.sse.ChunkInputs` gives them), or ("error", message);
    None for `[DONE]` or an event with its own type. For tests."""

def read_sse_body(parts: list[bytes]) -> tuple[list[tuple[Any, ...]], tuple[str, ...], str | None]:
    """A stream's body after the HTTP framing, read in `parts` by the Rust reader
    and ended: (inputs, end, finish_reason), as
    `parallelhue.reference.sse_body.read_body` gives them. For tests."""

@final
class RecordWriter:
    """A recording fed from Python (the reference path): the tap's encoder and
    writer, each call one item at the current time. OSError from the file."""

    def __new__(cls, path: str | os.PathLike[str], header: str) -> RecordWriter: ...
    def start(self, stream: int) -> None: ...
    def sse(self, stream: int, text: str, token_ids: list[int]) -> None: ...
    def sse_id(self, stream: int, id: str) -> None: ...
    def sse_choice(self, stream: int, index: int) -> None: ...
    def sse_usage(
        self,
        stream: int,
        completion_tokens: int | None,
        per_step_accepted: list[int] | None,
        per_step_drafted: list[int] | None,
    ) -> None: ...
    def sse_counts(
        self, stream: int, kind: str, a: int | None, b: int | None, c: int | None
    ) -> None:
        """A stock server's step counters ("timings" or "spec"): the server-reported
        tier's input; ValueError for another kind."""
    def finish(self, stream: int, reason: str | None = None) -> None: ...
    def end(self, stream: int, kind: str, status: int, detail: str) -> None: ...
    def frames(self, frames: list[bytes]) -> None: ...
    def reject(self, reason: str) -> None: ...
    def lost(self, frames: int | None) -> None: ...
    def stream_lost(self, stream: int, reason: str) -> None: ...
    def finalize(self) -> None: ...
    def close(self, footer: str | None = None) -> None: ...

@final
class HttpStreams:
    """Every stream's HTTP exchange in one Rust thread without the GIL: connect
    (connect_timeout, also the TLS handshake), TLS for `tls` (rustls; roots:
    webpki-roots and the system store, SSL_CERT_FILE/SSL_CERT_DIR in its place),
    the request, the response head, the SSE body. Deltas and ends go into
    `reconciler` (see Reconciler.take). With SSE_COALESCE_STREAMS or more
    streams open, reading rounds are at least `min_interval` seconds apart
    (0..1, else ValueError; default SSE_READ_INTERVAL). Unix only."""

    def __new__(
        cls,
        reconciler: Reconciler,
        host: str,
        port: int,
        tls: bool,
        shown: str,
        connect_timeout: float,
        read_timeout: float | None,
        write_timeout: float = 30.0,
        min_interval: float | None = None,
    ) -> HttpStreams: ...
    def add(
        self, stream: int, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> float:
        """Start `stream`'s request; returns its start time (time.monotonic's clock,
        as recorded). ValueError for a stream the reconciler would refuse (its
        message) or a header that would break the request."""
    def cancel(self, stream: int) -> None:
        """End `stream` as "cancelled" (also when its exchange was over)."""
    def fail(self, stream: int, detail: str) -> None:
        """End `stream` as "internal" with `detail`."""
    def subscribe(self, target: str, headers: list[tuple[str, str]], body: bytes) -> None:
        """Create the run's telemetry stream: `POST target` (docs/PROTOCOL.md, "HTTP
        telemetry stream"), read by the same thread. RuntimeError for a second one;
        ValueError for a header that would break the request."""
    def accept_telemetry(self) -> None:
        """Take the run the stream's preamble named: the reconciler gets its run id
        (before any other input) and every frame, from the first read, goes into it."""
    def telemetry(self) -> TelemetryState:
        """The telemetry stream so far."""
    def close(self) -> None:
        """Stop the thread and close every connection. Idempotent."""
    @property
    def closed(self) -> bool: ...
    @property
    def failed(self) -> bool:
        """The thread died (a bug): the streams it held will never end."""

@final
class Receiver:
    """The telemetry socket: binds `path` (AF_UNIX datagram, mode 0600 — 0622 when
    a uid other than root is in `accept_uids` —, SO_PASSCRED; the path must not
    exist) and pushes every datagram from this uid or from `accept_uids` into
    `reconciler` (its tap and reconciler, under its lock) from a Rust thread that
    never takes the GIL. Datagrams from other uids are dropped and counted
    (`rejected_uid`, `last_rejected_uid`); those admitted by `accept_uids`, too
    (`accepted_foreign`).

    Raises OSError when the socket cannot be bound (path too long for
    sun_path, path exists, directory missing, ...).
    """

    def __new__(
        cls,
        path: str | os.PathLike[str],
        reconciler: Reconciler,
        rcvbuf: int = 8 << 20,
        accept_uids: list[int] = ...,
    ) -> Receiver: ...
    @property
    def path(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    def pending(self) -> bool:
        """Whether datagrams that arrived before this call may not have reached the
        reconciler yet (queued in the kernel, or read and not yet pushed)."""
    def close(self) -> None:
        """Stop the thread (after it pushed what was queued), close, unlink. Idempotent."""
    def stats(self) -> ReceiverStats: ...
    def __enter__(self) -> Receiver: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool: ...
