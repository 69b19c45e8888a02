"""The SSE bodies of a run, read by one Rust thread (`parallelhue._native.SseReader`).

Each stream sends its request and reads its response head through httpx
(`transport.py`); then its connection is handed to the thread, which reads,
parses and pushes every delta into the Rust reconciler without the GIL. This
object collects what the thread queued, every `POLL_INTERVAL`, feeds the screen
model through the sink's `on_reads`, and wakes each stream's task when its body
is over. Arrival times are taken by the thread at each read; with several
streams open its reading rounds are `_native.SSE_READ_INTERVAL` apart (5 ms),
which bounds its wake-ups under load (`arrival_note` says so on screen).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .transport import LeanBody

__all__ = ["POLL_INTERVAL", "BodyEnd", "NativeStreamReader", "ReadSink"]

# How often the queue is collected (the screen model is drawn at 4 Hz).
POLL_INTERVAL = 0.02


class ReadSink(Protocol):
    def on_reads(
        self, stream: int, texts: list[str], times: list[float], tokens: int, text_bytes: int
    ) -> None: ...


@dataclass(frozen=True)
class BodyEnd:
    """How a stream's body ended: `end` is done ([DONE]), eof (ended without
    it), error (a bad SSE event), framing (broken HTTP framing), cut (the
    connection closed inside the body), timeout or io; `message` says more."""

    end: str
    message: str | None
    finish_reason: str | None
    usage: dict[str, Any] | None


class NativeStreamReader:
    """One per run; `read` is awaited by each stream's task."""

    def __init__(self, reader_class: Callable[..., Any], reconciler: Any | None, sink: ReadSink):
        self._reader = reader_class(reconciler)
        self._sink = sink
        self._waiting: dict[int, asyncio.Future[BodyEnd]] = {}
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def create(cls, reconciler: Any | None, sink: ReadSink) -> NativeStreamReader | None:
        """None where the native module has no reader (not built, not Unix)."""
        try:
            from ._native import SseReader
        except ImportError:
            return None
        return cls(SseReader, reconciler, sink)

    @staticmethod
    def arrival_note() -> str:
        """How precise the arrival times it takes are (the summary's latency line)."""
        from ._native import SSE_COALESCE_STREAMS, SSE_READ_INTERVAL

        return (
            f"arrival times to {SSE_READ_INTERVAL * 1000:g} ms while "
            f"{SSE_COALESCE_STREAMS}+ streams are open"
        )

    async def read(self, stream: int, response: LeanBody) -> BodyEnd:
        """Hand `response`'s connection to the thread; return when its body is over."""
        if self._task is None:
            self._task = asyncio.create_task(self._poll())
        future: asyncio.Future[BodyEnd] = asyncio.get_running_loop().create_future()
        self._waiting[stream] = future
        fd, initial = response.detach()
        try:
            self._reader.add(
                stream, fd, response.framing, response.length, initial, response.read_timeout
            )
            return await future
        except BaseException:
            # Cancelled (Ctrl-C, exact mode stopping every stream): drop the connection.
            self._reader.remove(stream)
            raise
        finally:
            self._waiting.pop(stream, None)

    def collect(self) -> None:
        """Apply what the thread queued: deltas first, then the ended bodies.

        Raises RuntimeError if the thread died, so no stream waits forever."""
        if self._reader.failed:
            raise RuntimeError("the Rust SSE reading thread stopped unexpectedly")
        reads, finished = self._reader.take()
        on_reads = self._sink.on_reads
        for stream, texts, times, tokens, text_bytes in reads:
            on_reads(stream, texts, times, tokens, text_bytes)
        for stream, end, message, finish_reason, usage in finished:
            future = self._waiting.get(stream)
            if future is not None and not future.done():
                future.set_result(BodyEnd(end, message, finish_reason, usage))

    async def _poll(self) -> None:
        try:
            while True:
                await asyncio.sleep(POLL_INTERVAL)
                self.collect()
        except Exception as error:
            # Never leave a stream waiting on a poller that died: it gets the error.
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(error)

    def close(self) -> None:
        """Stop the thread (closing every connection it holds) and the polling."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        with contextlib.suppress(Exception):
            self._reader.close()
