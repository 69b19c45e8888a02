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
    "Receiver",
    "Reconciler",
    "SseParser",
    "decode_frame",
]

PROTOCOL_VERSION: int
MAX_FRAME_BYTES: int
REORDER_WINDOW: int

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
