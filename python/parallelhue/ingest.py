"""The shipped path of a live run: Rust threads read everything, Python draws.

`RustIngest` holds a run's `parallelhue._native` objects: the `Reconciler`
(with the `--record` tap and the screen's queue under its lock), the
`Receiver` thread (telemetry datagrams) and the `HttpStreams` thread (every
stream's whole HTTP exchange, TLS included, its SSE deltas pushed into the
reconciler, its end applied by the thread itself). Python composes the
requests (`streams.py`) and then only collects: `poll()` applies one
`Reconciler.take()` batch — new text once per stream, spans as byte ranges
of it, verdicts, stream ends — to the screen model. docs/ARCHITECTURE.md has
the picture.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from . import _native
from .feed import Feed
from .receiver import ReceiverError
from .record import RecordingError
from .state import RunModel
from .stream_errors import end_message
from .streams import StreamRequest, body_bytes, connect_target, request_headers

__all__ = ["RustIngest"]


class RustIngest:
    """One live run on the Rust path (any view, with or without --record)."""

    def __init__(
        self,
        model: RunModel,
        feed: Feed,
        *,
        run_id: str,
        endpoint: str,
        requests: Sequence[tuple[StreamRequest, dict[str, Any]]],
        api_key: str | None,
        timeout: float,
        socket_path: str | None,
        record: tuple[str, dict[str, Any]] | None = None,
        min_interval: float | None = None,
        extra_headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.model = model
        self.feed = feed
        self.endpoint = endpoint
        self.requests = list(requests)
        self.api_key = api_key
        self.extra_headers = tuple(extra_headers)  # --header
        self.timeout = timeout
        self.reconciler = _native.Reconciler(run_id, len(model.streams))
        self.receiver: _native.Receiver | None = None
        self._ended: set[int] = set()
        self._closed = False
        if record is not None:
            path, header = record
            try:
                self.reconciler.record(path, json.dumps(header, ensure_ascii=False))
            except OSError as error:
                raise RecordingError(
                    f"--record: cannot write {path}: {error.strerror or error}"
                ) from None
        try:
            if socket_path is not None:
                try:
                    self.receiver = _native.Receiver(socket_path, self.reconciler)
                except (OSError, ValueError) as error:
                    reason = getattr(error, "strerror", None) or error
                    raise ReceiverError(
                        f"cannot bind telemetry socket {socket_path}: {reason}"
                    ) from None
            target = connect_target(endpoint)
            self.target = target
            self.streams = _native.HttpStreams(
                self.reconciler,
                target.host,
                target.port,
                target.tls,
                target.shown,
                min(timeout, 30.0),
                timeout,
                min_interval=min_interval,
            )
        except BaseException:
            self._release(None)
            raise

    @staticmethod
    def arrival_note() -> str:
        """How precise the arrival times the thread takes are (the summary's latency line)."""
        return (
            f"arrival times to {_native.SSE_READ_INTERVAL * 1000:g} ms while "
            f"{_native.SSE_COALESCE_STREAMS}+ streams are open"
        )

    # --- the run -------------------------------------------------------------------

    def start(self) -> None:
        """Hand every stream's request to the HTTP thread."""
        target = self.target
        for request, body in self.requests:
            self.model.streams[request.index].started_at = self.streams.add(
                request.index,
                "POST",
                target.path,
                request_headers(target, self.api_key, request.request_id, self.extra_headers),
                body_bytes(body),
            )

    def poll(self) -> None:
        """Apply what the threads produced since the last call to the model."""
        if self.streams.failed:
            for state in self.model.streams:
                if state.index not in self._ended:
                    self._ended.add(state.index)
                    self.feed.end(
                        state.index, "internal", 0, "the Rust HTTP thread stopped unexpectedly"
                    )
        texts, spans, events, ends = self.reconciler.take()
        streams = self.model.streams
        for stream, utf8, chunk_ends, times, tokens in texts:
            try:
                streams[stream].add_text(utf8, chunk_ends, times, tokens)
            except Exception as error:
                self._failed_here(stream, error)
        records, index = spans
        view = memoryview(records)
        for stream, start, end in index:
            try:
                streams[stream].add_span_runs(view[start:end])
            except Exception as error:
                self._failed_here(stream, error)
        self.feed.events(events)
        for stream, kind, status, detail, finish_reason, usage, _at in ends:
            self._ended.add(stream)
            try:
                self.feed.end(stream, kind, status, detail, finish_reason, usage)
            except Exception as error:
                self._failed_here(stream, error)

    def _failed_here(self, stream: int, error: Exception) -> None:
        """Handling what stream `stream` received raised: that stream fails with
        the reason (recorded, and reported by the next batch); the others go on."""
        detail = f"{type(error).__name__}: {error}"
        state = self.model.streams[stream]
        if state.error is None:
            self.streams.fail(stream, detail)
            self.feed.stream_error(stream, end_message("internal", 0, detail, timeout=self.timeout))

    def streams_done(self) -> bool:
        """Every stream's exchange is over."""
        return len(self._ended) >= len(self.model.streams)

    def cancel(self, stream: int) -> None:
        self.model.streams[stream].cancelled = True
        self.streams.cancel(stream)

    def update_stats(self) -> None:
        if self.model.mode != "chunk":
            self.feed.stats(self.reconciler)

    def finalize(self) -> None:
        if self.model.mode != "chunk":
            self.reconciler.finalize()
        self.poll()
        self.update_stats()

    # --- the end -------------------------------------------------------------------

    def _release(self, footer: dict[str, Any] | None) -> None:
        streams = getattr(self, "streams", None)
        if streams is not None:
            streams.close()
        if self.receiver is not None:
            self.receiver.close()
        try:
            self.reconciler.close_record(
                None if footer is None else json.dumps(footer, ensure_ascii=False)
            )
        except OSError as error:
            raise RecordingError(f"--record: writing failed: {error.strerror or error}") from None

    def close(self, footer: dict[str, Any] | None = None) -> None:
        """Stop the threads (closing every connection and the socket) and finish
        the recording (`footer` None: an interrupted run). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._release(footer)

    def receiver_stats(self) -> Mapping[str, object]:
        return self.receiver.stats() if self.receiver is not None else {}


def native_available() -> bool:
    """The extension is built with the HTTP thread (Unix)."""
    return hasattr(_native, "HttpStreams") and os.name == "posix"
