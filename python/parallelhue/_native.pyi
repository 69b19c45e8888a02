"""Type stubs of `parallelhue._native`, the PyO3 bindings of the Rust core (rust/py).

The `Reconciler` API is exactly the one of docs/PROTOCOL.md ("Python-facing
API"), shared with `parallelhue.reference.Reconciler` (and typed like the
`parallelhue.reconciler.ReconcilerLike` protocol, so either fits it).
"""

import os
from types import TracebackType
from typing import Any, Literal, TypeAlias, TypedDict, final, type_check_only

__all__ = [
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "REORDER_WINDOW",
    "SSE_COALESCE_STREAMS",
    "SSE_READ_INTERVAL",
    "HttpBody",
    "Receiver",
    "Reconciler",
    "SseParser",
    "SseReader",
    "decode_frame",
]

PROTOCOL_VERSION: int
MAX_FRAME_BYTES: int
REORDER_WINDOW: int
SSE_READ_INTERVAL: float  # seconds; SseReader's default min_interval (Unix only)
SSE_COALESCE_STREAMS: int  # open connections from which rounds are spaced (Unix only)

# drain() events, in the order they happened:
#   ("span", stream, byte_start, text, step index or None (mixed span), first_offset, n_tokens)
#   ("exact", stream)
#   ("failed", stream, reason)
#   ("run", message)        run-level messages, rejected frames included
_Event: TypeAlias = tuple[Any, ...]

@final
class Reconciler:
    """The three-witness reconciler of one run (docs/PROTOCOL.md "Reconciliation").

    Raises ValueError with the protocol's messages for an invalid run id,
    num_streams, stream index or token id.
    """

    def __new__(cls, run_id: str, num_streams: int) -> Reconciler: ...
    def push_frame(self, frame: bytes) -> None:
        """One datagram (already uid-checked)."""
    def push_frames(self, frames: list[bytes]) -> None:
        """Several datagrams, in order; the GIL is released meanwhile."""
    def push_inputs(self, inputs: list[tuple[Any, ...]]) -> None:
        """Several inputs, in order, exactly as the single calls: ("frame", bytes),
        ("sse", stream, text, token_ids) or ("finish", stream). Converted while
        holding the GIL, pushed with it released; a bad item raises the single
        call's ValueError (or "invalid input ...") after the items before it."""
    def push_sse(self, stream: int, text: str, token_ids: list[int]) -> None:
        """One SSE delta of one stream: the choice's text and its token_ids."""
    def finish_sse(self, stream: int) -> None:
        """The stream's SSE ended normally."""
    def finalize(self) -> None:
        """Every stream that is neither exact nor failed gets its verdict."""
    def drain(self) -> list[_Event]:
        """The events since the previous call."""
    def stream_stats(self, stream: int) -> dict[str, Any]:
        """Keys: tokens steps hist drafts_scheduled drafts_padded plain accepted
        target bonus surplus_tokens surplus_accepted surplus_target surplus_bonus
        surplus_plain mixed_spans bytes; ints, except `hist`: dict[int, int]
        (tokens in a settled record -> number of records)."""
    def totals(self) -> dict[str, Any]:
        """`stream_stats` summed over the streams."""
    def counters(self) -> dict[str, int]:
        """frames rejected_frames duplicate_frames foreign_records dropped_reported gaps."""
    def sources(self) -> list[dict[str, Any]]:
        """One per hello seen: source_id, role ("scheduler" | "frontend"), engine
        ("vllm" | "simulated"), role_derivation ("none" | "draft_ids" | "counts"),
        async_scheduling (bool), num_speculative_tokens, plugin_version,
        engine_version, spec_method."""
    def verdict(self, stream: int) -> tuple[str, str | None]:
        """("pending" | "exact" | "failed", the failure reason or None)."""

def decode_frame(frame: bytes | bytearray) -> dict[str, Any]:
    """Decode one datagram into the decoded-meaning dict of tests/vectors/*.json.

    Raises ValueError with the protocol's exact decoder message.
    """

@type_check_only
class SseChoice(TypedDict):
    index: int
    text: str
    """`delta.content` (chat) or `text` (completions); "" when absent or null."""
    token_ids: list[int] | None
    finish_reason: str | None

@type_check_only
class SseUsage(TypedDict):
    prompt_tokens: int | None
    completion_tokens: int | None
    total_tokens: int | None

@type_check_only
class SseChunkEvent(TypedDict):
    kind: Literal["chunk"]
    id: str | None
    choices: list[SseChoice]
    usage: SseUsage | None

@type_check_only
class SseDoneEvent(TypedDict):
    """`data: [DONE]`."""

    kind: Literal["done"]

@type_check_only
class SseOtherEvent(TypedDict):
    """An event with a non-default `event:` type, passed through."""

    kind: Literal["other"]
    event: str
    data: str

@type_check_only
class SseErrorEvent(TypedDict):
    """Malformed input (bad JSON, wrong shape, invalid UTF-8, over-long line,
    an in-stream server error, a body ending inside an event); parsing goes on."""

    kind: Literal["error"]
    message: str

_SseEvent: TypeAlias = SseChunkEvent | SseDoneEvent | SseOtherEvent | SseErrorEvent

@final
class SseParser:
    """Incremental parser of an OpenAI chat/completions SSE body."""

    def __new__(cls) -> SseParser: ...
    def feed(self, data: bytes) -> list[_SseEvent]:
        """Feed body bytes (split anywhere); returns the events they complete, in order."""
    def finish(self) -> list[_SseEvent]:
        """The body ended; an unterminated event is reported as an error."""

_Framing: TypeAlias = Literal["chunked", "length", "close"]

@final
class HttpBody:
    """An HTTP/1.1 response body decoder: chunked, Content-Length ("length",
    with `length`) or close-delimited. Raises ValueError on a bad framing name."""

    def __new__(cls, framing: _Framing | str, length: int | None = None) -> HttpBody: ...
    def feed(self, data: bytes) -> bytes:
        """Bytes from the connection (split anywhere) -> the body bytes they hold.
        Raises ValueError with the precise framing error; errors are final."""
    def close(self) -> None:
        """The connection closed; ValueError if the body was cut short."""
    @property
    def complete(self) -> bool:
        """The whole body was read."""

_Read: TypeAlias = tuple[int, list[str], list[float], int, int]
_Finished: TypeAlias = tuple[int, str, str | None, str | None, SseUsage | None]

@final
class SseReader:
    """The SSE reading thread: reads handed-over connections without the GIL
    (HTTP framing, SSE, chunk JSON), pushes each delta (the first choice's text
    and token ids) into `reconciler` exactly as `Reconciler.push_sse` would, and
    queues what the screen model needs. With SSE_COALESCE_STREAMS or more
    connections open, reading rounds are at least `min_interval` seconds apart
    (0..1, else ValueError; default SSE_READ_INTERVAL). Unix only."""

    def __new__(
        cls, reconciler: Reconciler | None = None, min_interval: float | None = None
    ) -> SseReader: ...
    def add(
        self,
        stream: int,
        fd: int,
        framing: _Framing | str,
        length: int | None,
        initial: bytes,
        timeout: float | None,
    ) -> None:
        """Read `stream` from `fd` (owned by the reader from now on; -1 for a
        connection that already closed); `initial` are body bytes read with the
        head; `timeout` the longest silence (None: none). ValueError for a
        stream the reconciler would refuse (its own message), a bad framing or
        a non-positive timeout."""
    def remove(self, stream: int) -> None:
        """Stop reading `stream` and close its descriptor (nothing is reported for it)."""
    def take(self) -> tuple[list[_Read], list[_Finished]]:
        """Since the last call: reads (stream, non-empty texts, one arrival time
        per delta, tokens, UTF-8 bytes of the texts), then finished streams
        (stream, end, message, finish_reason, usage); end is "done" ([DONE]),
        "eof" (the body ended without it), "error" (bad SSE event), "framing"
        (broken HTTP framing), "cut" (closed inside the body), "timeout" or "io"."""
    def close(self) -> None:
        """Stop the thread and close every descriptor it holds. Idempotent."""
    @property
    def closed(self) -> bool: ...
    @property
    def failed(self) -> bool:
        """The thread died (a bug): the streams it held will never finish."""

@final
class Receiver:
    """The telemetry socket: binds `path` (AF_UNIX datagram, mode 0600,
    SO_PASSCRED; the path must not exist) and pushes every datagram from this
    uid into `reconciler` from a Rust thread that never takes the GIL.
    Datagrams from other uids are dropped and counted (`rejected_uid`).

    Raises OSError when the socket cannot be bound (path too long for
    sun_path, path exists, directory missing, ...).
    """

    def __new__(
        cls, path: str | os.PathLike[str], reconciler: Reconciler, rcvbuf: int = 8 << 20
    ) -> Receiver: ...
    @property
    def path(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None:
        """Stop the thread (after it pushed what was queued), close, unlink. Idempotent."""
    def stats(self) -> dict[str, int]:
        """datagrams, bytes, rejected_uid, oversized, batches, errors, rcvbuf."""
    def __enter__(self) -> Receiver: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool: ...
