"""The shipped path of a live run: Rust threads read everything, Python draws.

`RustIngest` holds a run's `parallelhue._native` objects: the `Reconciler`
(with the `--record` tap and the screen's queue under its lock), the
`Receiver` thread (telemetry datagrams) and the `HttpStreams` thread (every
stream's whole HTTP exchange, TLS included, its SSE deltas pushed into the
reconciler, its end applied by the thread itself; with `--telemetry http`
each response's in-band frames too, pushed like datagrams). Python composes the
requests (`streams.py`) and then only collects: `poll()` applies one
`Reconciler.take()` batch — new text once per stream, the spans over it
appended to each stream's `SpanRecords` in Rust, verdicts, stream ends — to
the screen model. docs/ARCHITECTURE.md has
the picture.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, cast

from .. import _native
from ..model.state import RunModel
from ..model.stream_errors import end_message
from .feed import Feed
from .receiver import ReceiverError
from .record import RecordingError
from .streams import (
    StreamRequest,
    body_bytes,
    connect_target,
    request_headers,
)
from .telemetry import TelemetryPlan, tell_rejected_uid

__all__ = ["RustIngest"]


class RustIngest:
    """One live run on the Rust path (any view, with or without --record).

    Opened in three steps: the constructor starts the HTTP thread; `open_run()`
    gives the run's id; `begin()` starts the recording, binds the socket (unless
    the telemetry comes in-band, inside each response), and takes the requests
    composed with that id. Then `start()`.
    """

    def __init__(
        self,
        model: RunModel,
        feed: Feed,
        *,
        run_id: str,
        endpoint: str,
        api_key: str | None,
        timeout: float,
        telemetry: TelemetryPlan | None,
        socket_path: str | None = None,
        min_interval: float | None = None,
        extra_headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.model = model
        self.feed = feed
        self.endpoint = endpoint
        self.requests: list[tuple[StreamRequest, dict[str, Any]]] = []
        self.api_key = api_key
        self.extra_headers = tuple(extra_headers)  # --header
        self.timeout = timeout
        self.telemetry = telemetry
        self.socket_path = socket_path if telemetry is not None else None
        # In-band: each request asks for its telemetry inside its own response.
        self.inband = telemetry is not None and telemetry.path == "http"
        self.run_id = run_id
        # Spans reach the screen only through take(): packed, without their text.
        self.reconciler = _native.Reconciler(run_id, len(model.streams), packed_spans=True)
        self.receiver: _native.Receiver | None = None
        self._ended: set[int] = set()
        self._closed = False
        self._told_rejected = False
        try:
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

    async def open_run(self) -> str:
        """The run's id (the client's own)."""
        return self.run_id

    def begin(
        self,
        requests: Sequence[tuple[StreamRequest, dict[str, Any]]],
        record: tuple[str, dict[str, Any]] | None = None,
    ) -> None:
        """Start the recording, then the telemetry (bind the socket, unless it comes
        in-band): nothing reaches the reconciler before the tap."""
        self.requests = list(requests)
        if record is not None:
            path, header = record
            try:
                self.reconciler.record(path, json.dumps(header, ensure_ascii=False))
            except OSError as error:
                raise RecordingError(
                    f"--record: cannot write {path}: {error.strerror or error}"
                ) from None
        if self.socket_path is not None and not self.inband:
            accept = list(self.telemetry.accept_uids) if self.telemetry is not None else []
            try:
                self.receiver = _native.Receiver(
                    self.socket_path, self.reconciler, accept_uids=accept
                )
            except (OSError, ValueError) as error:
                reason = getattr(error, "strerror", None) or error
                raise ReceiverError(
                    f"cannot bind telemetry socket {self.socket_path}: {reason}"
                ) from None

    @staticmethod
    def arrival_note() -> str:
        """How precise the arrival times the thread takes are (the summary's latency line)."""
        return (
            f"arrival times to {_native.SSE_READ_INTERVAL * 1000:g} ms while "
            f"{_native.SSE_COALESCE_STREAMS}+ streams are open"
        )

    # --- the run -------------------------------------------------------------------

    def start(self) -> None:
        """Hand every request to the HTTP thread at once."""
        for request, _body in self.requests:
            self.start_request(request.index)

    def start_request(self, index: int) -> None:
        """Hand request `index` to the HTTP thread (--requests: when a stream is free)."""
        target = self.target
        request, body = self.requests[index]
        at = self.streams.add(
            request.index,
            "POST",
            request.path or target.path,
            request_headers(
                target, self.api_key, request.request_id, self.extra_headers, self.inband
            ),
            body_bytes(body),
        )
        self.model.start_stream(request.index, at)

    def telemetry_pending(self) -> bool:
        """Whether datagrams already sent may still be on their way into the reconciler."""
        return self.receiver is not None and self.receiver.pending()

    def poll(self) -> None:
        """Apply what the threads produced since the last call to the model."""
        if self.streams.failed:
            for state in self.model.streams:
                if state.index not in self._ended:
                    self._ended.add(state.index)
                    self.feed.end(
                        state.index, "internal", 0, "the Rust HTTP thread stopped unexpectedly"
                    )
        streams = self.model.streams
        # Each stream's new spans land on its span_records inside take().
        records = cast("list[_native.SpanRecords]", [s.span_records for s in streams])
        texts, events, ends = self.reconciler.take(records)
        for stream, utf8, chunk_ends, times, tokens, reported in texts:
            try:
                streams[stream].add_text(utf8, chunk_ends, times, tokens, reported)
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
        self._told_rejected = tell_rejected_uid(
            self.receiver, self._told_rejected, self.feed.run_message
        )

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
        if self.receiver is not None:
            return self.receiver.stats()
        return {}


def native_available() -> bool:
    """The extension is built with the HTTP thread (Unix)."""
    return hasattr(_native, "HttpStreams") and os.name == "posix"
