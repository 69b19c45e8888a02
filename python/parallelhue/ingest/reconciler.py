"""Pick the reconciler: the Rust core (default) or the pure-Python reference.

Both implement the same API and semantics (docs/PROTOCOL.md, "Python-facing
API"; the shapes of what they return are `shapes.py`), so the reference path
and replay never need to know which one they got. The shipped path drives the
Rust one through `native.py`.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from ..model.shapes import Counters, Event, SourceInfo, StreamStats

__all__ = ["ReconcilerError", "ReconcilerLike", "make_reconciler", "reconciler_class"]


class ReconcilerError(Exception):
    """The requested reconciler cannot be used; one line naming the fix."""


class ReconcilerLike(Protocol):
    def push_frame(self, frame: bytes) -> None: ...
    def push_frames(self, frames: list[bytes]) -> None: ...
    def push_sse(self, stream: int, text: str, token_ids: list[int]) -> None: ...
    def push_sse_id(self, stream: int, chunk_id: str) -> None: ...
    def push_sse_choice(self, stream: int, index: int) -> None: ...
    def push_sse_usage(
        self,
        stream: int,
        completion_tokens: int | None,
        per_step_accepted: list[int] | None,
        per_step_drafted: list[int] | None,
    ) -> None: ...
    def push_inputs(self, inputs: list[tuple[Any, ...]]) -> None: ...
    def push_lost(self, frames: int | None) -> None: ...
    def push_stream_lost(self, stream: int, reason: str) -> None: ...
    def finish_sse(self, stream: int, finish_reason: str | None) -> None: ...
    def finalize(self) -> None: ...
    def drain(self) -> list[Event]: ...
    def stream_stats(self, stream: int) -> StreamStats: ...
    def totals(self) -> StreamStats: ...
    def counters(self) -> Counters: ...
    def sources(self) -> list[SourceInfo]: ...
    def verdict(self, stream: int) -> tuple[str, str | None]: ...


def _load(module_name: str, missing_hint: str) -> Any:
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ReconcilerError(f"{missing_hint} ({error})") from None
    cls = getattr(module, "Reconciler", None)
    if cls is None:
        raise ReconcilerError(f"{missing_hint} ({module_name} has no Reconciler)")
    return cls


RUST_MISSING = "the Rust reconciler is not built: run `make native`, or use --reconciler python"


def reconciler_class(kind: str) -> Any:
    """The Reconciler class for `kind` ("rust" or "python")."""
    if kind == "rust":
        return _load("parallelhue._native", RUST_MISSING)
    if kind == "python":
        return _load("parallelhue.reference", "the reference reconciler cannot be imported")
    raise ReconcilerError(f"--reconciler must be one of rust, python, got '{kind}'")


def make_reconciler(kind: str, run_id: str, num_streams: int) -> ReconcilerLike:
    """A fresh reconciler for one run."""
    cls = reconciler_class(kind)
    try:
        reconciler: ReconcilerLike = cls(run_id, num_streams)
    except ValueError as error:
        raise ReconcilerError(str(error)) from None
    return reconciler
