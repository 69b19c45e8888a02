"""Pick the reconciler: the Rust core (default) or the pure-Python reference.

Both implement the same API and semantics (docs/PROTOCOL.md, "Python-facing
API"), so the session never needs to know which one it got.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

__all__ = ["ReconcilerError", "ReconcilerLike", "make_reconciler"]

Event = tuple[Any, ...]


class ReconcilerError(Exception):
    """The requested reconciler cannot be used; one line naming the fix."""


class ReconcilerLike(Protocol):
    def push_frame(self, frame: bytes) -> None: ...
    def push_frames(self, frames: list[bytes]) -> None: ...
    def push_sse(self, stream: int, text: str, token_ids: list[int]) -> None: ...
    def finish_sse(self, stream: int) -> None: ...
    def finalize(self) -> None: ...
    def drain(self) -> list[Event]: ...
    def stream_stats(self, stream: int) -> dict[str, Any]: ...
    def totals(self) -> dict[str, Any]: ...
    def counters(self) -> dict[str, int]: ...
    def sources(self) -> list[dict[str, Any]]: ...
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


def reconciler_class(kind: str) -> Any:
    """The Reconciler class for `kind` ("rust" or "python")."""
    if kind == "rust":
        return _load(
            "parallelhue._native",
            "the Rust reconciler is not built: run `make native`, or use --reconciler python",
        )
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
