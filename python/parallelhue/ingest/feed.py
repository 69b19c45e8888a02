"""What the screen model learns from a run's reconciler and streams.

Both ways a run is fed — the Rust path's packed batches (`native.py`) and the
reference path or a replay (`driver.RunDriver`) — end up here for the parts
they share: verdicts and run messages, how each stream ended (through the one
message mapper, `stream_errors.end_message`), the statistics and the backend
verdict. `on_failure` is told of every stream that fails, HTTP or verdict.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import cast

from ..model.advice import REJECTED_PREFIX, explain_reason, fix_line
from ..model.backend import detect_backend
from ..model.results import DRAFTS_BY_POSITION
from ..model.sanitize import one_line
from ..model.shapes import (
    EndKind,
    Event,
    ExactEvent,
    FailedEvent,
    MetricsSnapshot,
    SpanEvent,
    Usage,
)
from ..model.state import RunModel
from ..model.stream_errors import end_message
from .reconciler import ReconcilerLike

__all__ = ["Feed", "reconciler_line"]

_PROTOCOL_VERSION = re.compile(r"unsupported protocol version (\d+) \(this build speaks (\d+)\)")


def reconciler_line(message: str) -> str:
    """A run message as one line; a protocol version mismatch names the fix."""
    line = one_line(message)
    found = _PROTOCOL_VERSION.search(line)
    if found is None:
        return line
    sent, spoken = int(found.group(1)), int(found.group(2))
    if sent < spoken:
        # Protocol N is spoken by parallelhue-vllm 0.N (0.2 for protocol 2, 0.3 for 3).
        return (
            f"{line}: the server's parallelhue-vllm plugin is too old; "
            f"run pip install 'parallelhue-vllm>=0.{spoken}' in the server's vLLM environment"
        )
    return f"{line}: the server's parallelhue-vllm plugin is newer than this client; upgrade it"


class Feed:
    """Updates one `RunModel`; `timeout` is the run's --timeout (for messages)."""

    def __init__(
        self,
        model: RunModel,
        *,
        timeout: float,
        backend_override: str = "auto",
        metrics_before: MetricsSnapshot | None = None,
    ) -> None:
        self.model = model
        self.timeout = timeout
        self.backend_override = backend_override
        self.metrics_before = metrics_before
        self.on_failure: Callable[[int], None] | None = None
        # For the fix line: the reconciler's first stream failure, as it said it, and
        # the frames it rejected (each one a run message), with the first one's reason.
        self.first_reason: str | None = None
        # What the server-reported tier saw of speculative decoding (backend evidence).
        self.reported: str | None = None
        self.rejected = 0
        self.first_rejection: str | None = None

    def _advise(self) -> None:
        self.model.fix = fix_line(self.model, self.first_reason, self.rejected)

    def _failed(self, stream: int) -> None:
        if self.model.first_failure is None:
            self.model.first_failure = stream
        if self.on_failure is not None:
            self.on_failure(stream)

    def stream_error(self, stream: int, message: str) -> None:
        """Stream `stream` failed on its own: `message` is the user's line."""
        self.model.streams[stream].fail_http(message)
        self._failed(stream)

    def end(
        self,
        stream: int,
        kind: EndKind | None,
        status: int,
        detail: str,
        finish_reason: str | None = None,
        usage: Usage | None = None,
    ) -> None:
        """How stream `stream`'s exchange ended (kind None: normally)."""
        state = self.model.streams[stream]
        if usage is not None:
            state.usage = usage
        if kind is None:
            state.sse_finished = True
            state.finish_reason = finish_reason
            if self.model.mode != "chunk":
                state.judge_reported(self.model.stop_strings)
                if state.reported is not None and state.reported.speculative:
                    self._reported_engine(state.reported.engine)
        elif kind == "cancelled":
            state.cancelled = True
        else:
            self.stream_error(stream, end_message(kind, status, detail, timeout=self.timeout))

    def events(self, events: Iterable[Event]) -> None:
        """Reconciler events in order (spans included: the reference path)."""
        if self.model.mode == "chunk":
            return  # chunk mode ignores telemetry: no verdict, no proven span
        streams = self.model.streams
        for event in events:
            kind = event[0]
            if kind == "span":
                _, stream, byte_start, text, step, _first, _count = cast(SpanEvent, event)[:7]
                # C2: an 8th element carries the span's token role (None: mixed or unknown).
                extra = tuple(event)[7:]
                role = cast(int | None, extra[0]) if extra else None
                if extra:
                    self.model.roles_reported = True
                streams[stream].add_span(byte_start, text, step, role)
            elif kind == "exact":
                streams[cast(ExactEvent, event)[1]].verdict = "exact"
            elif kind == "failed":
                _, index, reason = cast(FailedEvent, event)
                state = streams[index]
                state.verdict = "failed"
                state.reason = explain_reason(reason, self.rejected, self.first_rejection)
                self._failed(index)
                if self.first_reason is None:
                    self.first_reason = reason
                    self._advise()
            elif kind == "run":
                self.run_message(str(event[1]))

    def run_message(self, message: str) -> None:
        """A line about the whole run (the reconciler's, or the client's own about
        its telemetry stream); repeated lines are shown once."""
        if message.startswith(REJECTED_PREFIX):
            self.rejected += 1
            if self.first_rejection is None:
                self.first_rejection = one_line(message)
        line = reconciler_line(message)
        messages = self.model.run_messages
        if not messages or messages[-1] != line:  # e.g. every frame of an old plugin
            messages.append(line)
            self._advise()

    def stats(self, reconciler: ReconcilerLike) -> None:
        """The reconciler's statistics, counters and sources, stored once."""
        model = self.model
        for state in model.streams:
            state.stats = reconciler.stream_stats(state.index)
        model.totals = reconciler.totals()
        if DRAFTS_BY_POSITION in model.totals:  # contract C2's stats: roles come with it
            model.roles_reported = True
        model.counters = reconciler.counters()
        silent = int(model.counters.get("frames", 0)) == 0
        for state in model.streams:
            state.plugin_silent = silent
        sources = reconciler.sources()
        if len(sources) != len(model.sources):
            model.sources = sources
            self.update_backend()

    def update_backend(self) -> None:
        self.model.backend = detect_backend(
            self.backend_override, self.model.sources, self.metrics_before, self.reported
        )

    def _reported_engine(self, engine: str | None) -> None:
        """A stream's server-reported steps show drafting: evidence of speculative
        decoding for the backend verdict (after a plugin hello, before /metrics)."""
        evidence = f"{engine} reports drafts per step"
        if self.reported != evidence:
            self.reported = evidence
            self.update_backend()

    def all_settled(self) -> bool:
        """Every stream that can still get a verdict has one."""
        return all(
            s.verdict != "pending" or s.error is not None or s.cancelled for s in self.model.streams
        )
