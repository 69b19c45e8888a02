"""Type stubs of `parallelhue._native`, the PyO3 bindings of the Rust core (rust/py).

The `Reconciler` API is exactly the one of docs/PROTOCOL.md ("Python-facing
API"), shared with `parallelhue.reference.Reconciler`.
"""

import os
from types import TracebackType
from typing import Literal, TypeAlias, TypedDict

PROTOCOL_VERSION: int
MAX_FRAME_BYTES: int
REORDER_WINDOW: int

SpanEvent: TypeAlias = tuple[Literal["span"], int, int, str, int | None, int, int]
"""("span", stream, byte_start, text, step_index or None for a mixed span, first_offset, n_tokens)"""
ExactEvent: TypeAlias = tuple[Literal["exact"], int]
FailedEvent: TypeAlias = tuple[Literal["failed"], int, str]
RunEvent: TypeAlias = tuple[Literal["run"], str]
Event: TypeAlias = SpanEvent | ExactEvent | FailedEvent | RunEvent

class Stats(TypedDict):
    tokens: int
    steps: int
    hist: dict[int, int]
    drafts_scheduled: int
    drafts_padded: int
    plain: int
    accepted: int
    target: int
    bonus: int
    surplus_tokens: int
    surplus_accepted: int
    surplus_target: int
    surplus_bonus: int
    surplus_plain: int
    mixed_spans: int
    bytes: int

class Counters(TypedDict):
    frames: int
    rejected_frames: int
    duplicate_frames: int
    foreign_records: int
    dropped_reported: int
    gaps: int

class SourceInfo(TypedDict):
    source_id: int
    role: Literal["scheduler", "frontend"]
    engine: Literal["vllm", "simulated"]
    role_derivation: Literal["none", "draft_ids", "counts"]
    async_scheduling: bool
    num_speculative_tokens: int
    plugin_version: str
    engine_version: str
    spec_method: str

class Reconciler:
    """The three-witness reconciler of one run.

    Raises ValueError with the protocol's messages for an invalid run id,
    num_streams, stream index or token id.
    """

    def __init__(self, run_id: str, num_streams: int) -> None: ...
    def push_frame(self, frame: bytes) -> None: ...
    def push_frames(self, frames: list[bytes]) -> None:
        """Push several datagrams; the GIL is released meanwhile."""
    def push_sse(self, stream: int, text: str, token_ids: list[int]) -> None: ...
    def finish_sse(self, stream: int) -> None: ...
    def finalize(self) -> None: ...
    def drain(self) -> list[Event]: ...
    def stream_stats(self, stream: int) -> Stats: ...
    def totals(self) -> Stats: ...
    def counters(self) -> Counters: ...
    def sources(self) -> list[SourceInfo]: ...
    def verdict(self, stream: int) -> tuple[Literal["pending", "exact", "failed"], str | None]: ...

def decode_frame(frame: bytes | bytearray) -> dict[str, object]:
    """Decode one datagram into the decoded-meaning dict of tests/vectors/*.json.

    Raises ValueError with the protocol's exact decoder message.
    """

class SseChoice(TypedDict):
    index: int
    text: str
    """`delta.content` (chat) or `text` (completions); "" when absent or null."""
    token_ids: list[int] | None
    finish_reason: str | None

class SseUsage(TypedDict):
    prompt_tokens: int | None
    completion_tokens: int | None
    total_tokens: int | None

class SseChunkEvent(TypedDict):
    kind: Literal["chunk"]
    id: str | None
    choices: list[SseChoice]
    usage: SseUsage | None

class SseDoneEvent(TypedDict):
    kind: Literal["done"]

class SseOtherEvent(TypedDict):
    """An event with a non-default `event:` type, passed through."""

    kind: Literal["other"]
    event: str
    data: str

class SseErrorEvent(TypedDict):
    """Malformed input (bad JSON, wrong shape, invalid UTF-8, over-long line,
    an in-stream server error, a body ending inside an event); parsing goes on."""

    kind: Literal["error"]
    message: str

SseEvent: TypeAlias = SseChunkEvent | SseDoneEvent | SseOtherEvent | SseErrorEvent

class SseParser:
    """Incremental parser of an OpenAI chat/completions SSE body."""

    def __init__(self) -> None: ...
    def feed(self, data: bytes) -> list[SseEvent]:
        """Feed body bytes (split anywhere); returns the events they complete, in order."""
    def finish(self) -> list[SseEvent]:
        """The body ended; an unterminated event is reported as an error."""

class ReceiverStats(TypedDict):
    datagrams: int
    bytes: int
    rejected_uid: int
    oversized: int
    batches: int
    errors: int
    rcvbuf: int

class Receiver:
    """The telemetry socket: binds `path` (AF_UNIX datagram, mode 0600,
    SO_PASSCRED; the path must not exist) and pushes every datagram from this
    uid into `reconciler` from a Rust thread that never takes the GIL.

    Raises OSError when the socket cannot be bound (path too long for
    sun_path, path exists, directory missing, ...).
    """

    def __init__(
        self, path: str | os.PathLike[str], reconciler: Reconciler, rcvbuf: int = 8 << 20
    ) -> None: ...
    @property
    def path(self) -> str: ...
    @property
    def closed(self) -> bool: ...
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
