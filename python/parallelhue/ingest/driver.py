"""Inputs in the order they happened, to the recording, the reconciler and the model.

`RunDriver` is the input sink of the reference path's readers (`reference.py`:
the httpx streams, `PyReceiver`) and of `parallelhue replay`, which re-feeds a
recording through it. The shipped path needs none: its Rust threads push into
the reconciler and the tap themselves (`native.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..model.sanitize import one_line
from ..model.shapes import EndKind, Usage
from ..model.state import RunModel
from .feed import Feed
from .reconciler import ReconcilerLike
from .record import RecordWriterLike
from .streams import StreamStopped

__all__ = ["RunDriver"]


class RunDriver:
    """The reference path's and replay's inputs: each goes to the recording (if
    any), the reconciler and the screen model, in the order it happened."""

    def __init__(
        self,
        model: RunModel,
        feed: Feed,
        reconciler: ReconcilerLike | None,
        recorder: RecordWriterLike | None = None,
    ) -> None:
        self.model = model
        self.feed = feed
        self.reconciler = reconciler
        self.recorder = recorder
        # The replayer swaps in the recording's clock so times match the original run.
        self.clock: Callable[[], float] = time.monotonic

    # --- inputs (streams.StreamSink) ------------------------------------------------

    def start(self, stream: int) -> None:
        self.model.start_stream(stream, self.clock())
        if self.recorder is not None:
            self.recorder.start(stream)

    def on_delta(self, stream: int, text: str, token_ids: list[int]) -> None:
        self.model.streams[stream].add_delta(text, token_ids, self.clock())
        if self.recorder is not None:
            self.recorder.sse(stream, text, token_ids)
        if self.reconciler is not None:
            try:
                self.reconciler.push_sse(stream, text, token_ids)
            except ValueError as error:  # e.g. a token id outside u32
                self.feed.stream_error(stream, f"invalid SSE data: {one_line(str(error))}")
                raise StreamStopped from None

    def on_sse_input(self, stream: int, item: tuple[Any, ...]) -> None:
        """An SSE input other than a delta (C2: sse_id, sse_choice, sse_usage; and
        sse_counts, which only the server-reported tier reads)."""
        if self.recorder is not None:
            self.recorder.sse_input(item)
        inputs = self.model.streams[stream].reported_inputs
        if item[0] == "sse_counts":
            inputs.add_counts(item[2], item[3:6])
            return
        if item[0] == "sse_usage":
            if item[2] is not None:
                inputs.completion_tokens = item[2]
            if item[3] is not None or item[4] is not None:
                inputs.add_lists(item[3], item[4])
        if self.reconciler is not None:
            try:
                self.reconciler.push_inputs([item])
            except (TypeError, ValueError) as error:  # e.g. a count outside u32
                self.feed.stream_error(stream, f"invalid SSE data: {one_line(str(error))}")
                raise StreamStopped from None

    def on_finish(self, stream: int, finish_reason: str | None) -> None:
        if self.recorder is not None:
            self.recorder.finish(stream, finish_reason)
        if self.reconciler is not None:
            self.reconciler.finish_sse(stream, finish_reason)
        self.feed.end(stream, None, 0, "", finish_reason)

    def on_end(self, stream: int, kind: EndKind, status: int, detail: str) -> None:
        if self.recorder is not None:
            self.recorder.end(stream, kind, status, detail)
        self.feed.end(stream, kind, status, detail)

    def on_usage(self, stream: int, usage: Usage) -> None:
        self.model.streams[stream].usage = usage

    def frames(self, frames: list[bytes]) -> None:
        if not frames or self.reconciler is None:
            return
        if self.recorder is not None:
            self.recorder.frames(frames)
        self.reconciler.push_frames(frames)

    def on_frame(self, stream: int, frame: bytes) -> None:
        """A frame the stream's response carried in-band."""
        self.frames([frame])

    def stream_lost(self, stream: int, reason: str) -> None:
        """The stream's in-band telemetry is missing frames: that stream fails."""
        if self.reconciler is None:
            return
        if self.recorder is not None:
            self.recorder.stream_lost(stream, reason)
        self.reconciler.push_stream_lost(stream, reason)

    def lost(self, frames: int | None) -> None:
        """Telemetry lost on its way here (docs/PROTOCOL.md, "Lost telemetry")."""
        if self.reconciler is None:
            return
        if self.recorder is not None:
            self.recorder.lost(frames)
        self.reconciler.push_lost(frames)

    def finalize(self) -> None:
        if self.reconciler is None:
            return
        if self.recorder is not None:
            self.recorder.finalize()
        self.reconciler.finalize()
        self.apply_events()
        self.update_stats()

    # --- outputs -------------------------------------------------------------------

    def apply_events(self) -> None:
        if self.reconciler is not None:
            self.feed.events(self.reconciler.drain())

    def update_stats(self) -> None:
        if self.reconciler is not None:
            self.feed.stats(self.reconciler)
