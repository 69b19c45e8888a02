"""One live run: the socket, the reconciler, the streams, the view, the verdicts.

A run takes one of two paths, chosen by `--reconciler`:
- `rust` (the shipped path, `ingest.RustIngest`): Rust threads do every
  stream's HTTP exchange and read the telemetry socket; the reconciler, the
  `--record` tap and the screen's queue share one lock; Python applies one
  packed batch per refresh to the screen model.
- `python` (the reference path, `ReferenceIngest` here): httpx streams and
  `PyReceiver` on this event loop feed the pure-Python reference reconciler
  through `RunDriver`, which `replay` reuses.

`Session` does what both share: model discovery, `/metrics`, the loop that
polls and redraws, exact mode's fail-closed stop, the grace period for late
telemetry, finalize, the outcome, cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from parallelhue_vllm.paths import (
    SocketPathError,
    default_socket_dir,
    ensure_socket_dir,
    socket_path,
)
from parallelhue_vllm.wire import request_id

from .backend import detect_backend
from .config import RunConfig
from .endpoint import api_base
from .feed import Feed
from .metrics import fetch_metrics, server_deltas
from .receiver import PyReceiver, ReceiverError
from .reconciler import ReconcilerError, ReconcilerLike, make_reconciler, reconciler_class
from .record import RecordingError, RecordWriterLike, open_writer
from .sanitize import one_line
from .shapes import EndKind, Usage
from .state import RunModel, StreamState
from .stream_errors import connect_reason
from .streams import StreamRequest, StreamStopped, build_body, make_client, read_stream
from .views import View

if TYPE_CHECKING:
    from .ingest import RustIngest

__all__ = [
    "GRACE_SECONDS",
    "ReferenceIngest",
    "RunDriver",
    "Session",
    "SessionResult",
    "SetupError",
    "outcome",
]

# After the last SSE stream ends, how long late telemetry may still arrive.
GRACE_SECONDS = 2.0
# How often the reference path (and the grace period) look for news.
PUMP_INTERVAL = 0.02


class SetupError(Exception):
    """The run cannot start; one line naming the fix (exit 2)."""


@dataclass  # its RunModel's repr is compact (state.py says why)
class SessionResult:
    exit_code: int
    message: str | None
    model: RunModel


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
        self.model.streams[stream].started_at = self.clock()
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
        """An SSE input other than a delta (C2: sse_id, sse_choice, sse_usage)."""
        if self.recorder is not None:
            self.recorder.sse_input(item)
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


def outcome(model: RunModel) -> tuple[int, str | None]:
    """Exit code and one-line message for a finished run."""
    streams = model.streams
    if model.mode == "exact":
        if all(s.verdict == "exact" for s in streams):
            return 0, None
        # The stream that failed first is to blame, with its own reason; the
        # streams stopped because of it are cancelled, not "not exact".
        blamed = next((s for s in streams if s.index == model.first_failure), None)
        if blamed is None:
            blamed = next(s for s in streams if s.verdict != "exact" and not s.cancelled)
        why = blamed.error or blamed.reason or "no verdict"
        message = f"exact mode: stream {blamed.index} is not exact: {one_line(why)}"
        cancelled = sum(1 for s in streams if s.cancelled and s.verdict != "exact")
        if cancelled:
            plural = "stream was" if cancelled == 1 else "streams were"
            message += f"; {cancelled} {plural} cancelled because of it"
        return 2, message
    failed = [s for s in streams if s.error is not None]
    if failed:
        first = failed[0]
        return 1, (
            f"{len(failed)} of {len(streams)} streams failed; "
            f"stream {first.index}: {one_line(first.error or '')}"
        )
    return 0, None


def new_run_id() -> str:
    return secrets.token_hex(16)


def resolve_socket(mode: str, socket_dir: str | None, run_id: str) -> str:
    """The socket path, checked in every mode; the directory is created unless chunk."""
    directory = socket_dir if socket_dir is not None else default_socket_dir()
    try:
        # The length is checked before anything is created: an over-long --socket-dir
        # is an error in every mode and leaves no directory behind.
        # chunk mode binds nothing, but a bad path is still an error, never silent.
        path = socket_path(os.path.abspath(directory), run_id)
        if mode == "chunk":
            return path
        directory = ensure_socket_dir(directory, create=True)
        return socket_path(directory, run_id)
    except SocketPathError as error:
        raise SetupError(str(error)) from None


async def discover_model(client: httpx.AsyncClient, endpoint: str) -> str:
    """The server's only model, from /v1/models."""
    url = api_base(endpoint) + "/models"
    try:
        response = await client.get(url, timeout=30.0)
    except httpx.HTTPError as error:
        raise SetupError(
            f"cannot list the server's models at {one_line(url)}: {connect_reason(error)}; "
            "give --model to skip this"
        ) from None
    if response.status_code != 200:
        raise SetupError(
            f"listing models at {one_line(url)} gave HTTP {response.status_code}: give --model"
        )
    try:
        data = response.json()
        names = [str(item["id"]) for item in data["data"]]
    except (ValueError, KeyError, TypeError):
        raise SetupError(f"{one_line(url)} did not return a model list: give --model") from None
    if len(names) != 1:
        listed = ", ".join(one_line(n, 60) for n in names[:5]) or "none"
        raise SetupError(
            f"the server lists {len(names)} models ({listed}): choose one with --model"
        )
    return names[0]


ViewFactory = Callable[[RunModel], View]
Requests = list[tuple[StreamRequest, dict[str, Any]]]


class IngestPath(Protocol):
    """What the session's loop needs of either path."""

    def start(self) -> None: ...
    def poll(self) -> None: ...
    def streams_done(self) -> bool: ...
    def cancel(self, stream: int) -> None: ...
    def update_stats(self) -> None: ...
    def finalize(self) -> None: ...
    def close(self, footer: dict[str, Any] | None = None) -> None: ...


class ReferenceIngest:
    """The reference path: httpx streams and `PyReceiver` on this event loop."""

    def __init__(
        self,
        model: RunModel,
        feed: Feed,
        client: httpx.AsyncClient,
        *,
        run_id: str,
        endpoint: str,
        requests: Requests,
        socket_path: str | None,
        record: tuple[str, dict[str, Any]] | None,
    ) -> None:
        self.model = model
        self.client = client
        self.endpoint = endpoint
        self.requests = requests
        reconciler: ReconcilerLike | None = None
        if model.mode != "chunk":
            try:
                reconciler = make_reconciler("python", run_id, len(model.streams))
            except ReconcilerError as error:
                raise SetupError(str(error)) from None
        recorder = open_writer(*record) if record is not None else None
        self.receiver: PyReceiver | None = None
        if reconciler is not None and socket_path is not None:
            try:
                self.receiver = PyReceiver(socket_path)
            except ReceiverError:
                if recorder is not None:
                    recorder.close(None)
                raise
        self.driver = RunDriver(model, feed, reconciler, recorder)
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self._closed = False

    def start(self) -> None:
        # The socket is read from this loop: the readers yield after every event.
        yield_each_read = self.receiver is not None
        for request, body in self.requests:
            self.driver.start(request.index)
            self.tasks[request.index] = asyncio.create_task(
                read_stream(
                    self.client,
                    self.endpoint,
                    body,
                    request,
                    self.driver,
                    yield_each_read=yield_each_read,
                )
            )

    def poll(self) -> None:
        if self.receiver is not None:
            self.driver.frames(self.receiver.take())
        self.driver.apply_events()

    def streams_done(self) -> bool:
        return all(task.done() for task in self.tasks.values())

    def cancel(self, stream: int) -> None:
        task = self.tasks.get(stream)
        if task is not None and not task.done():
            task.cancel()
        self.driver.on_end(stream, "cancelled", 0, "")

    def update_stats(self) -> None:
        self.driver.update_stats()

    def finalize(self) -> None:
        self.poll()
        self.driver.finalize()

    def close(self, footer: dict[str, Any] | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        for task in self.tasks.values():
            task.cancel()
        if self.receiver is not None:
            self.receiver.close()
        if self.driver.recorder is not None:
            self.driver.recorder.close(footer)

    def receiver_stats(self) -> Mapping[str, object]:
        return self.receiver.stats() if self.receiver is not None else {}


class Session:
    """A live run against a server."""

    def __init__(
        self,
        config: RunConfig,
        view_factory: ViewFactory,
        *,
        simulated: bool = False,
        title: str = "ParallelHue",
        run_id: str | None = None,
        extra_body: dict[str, Any] | None = None,
        grace: float | None = None,
    ) -> None:
        self.config = config
        # Request fields no flag sets (tests: stop strings); None: GRACE_SECONDS.
        self.extra_body = dict(extra_body or {})
        self.grace = grace
        self.view_factory = view_factory
        self.simulated = simulated
        self.title = title
        self.run_id = run_id or new_run_id()
        self.socket_path = resolve_socket(config.mode, config.socket_dir, self.run_id)
        self.model_name: str | None = config.model
        self._abort = asyncio.Event()
        self.path: RustIngest | ReferenceIngest | None = None

    def _header(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "run_id": self.run_id,
            "num_streams": cfg.concurrency,
            "mode": cfg.mode,
            "backend_override": cfg.backend,
            "simulated": self.simulated,
            "model": self.model_name,
            "max_tokens": cfg.max_tokens,
            "prompts": cfg.prompts,
            "timeout": cfg.timeout,
            "reconciler": cfg.reconciler,
            "started_unix": time.time(),
        }

    def _requests(self) -> Requests:
        cfg = self.config
        assert self.model_name is not None
        requests: Requests = []
        for index, prompt in enumerate(cfg.prompts):
            request = StreamRequest(
                index=index,
                request_id=request_id(self.run_id, index),
                prompt=prompt,
                seed=(cfg.seed + index) % 2**32,
            )
            body = build_body(
                cfg.endpoint, self.model_name, request, cfg.max_tokens, cfg.temperature
            )
            body.update(self.extra_body)
            requests.append((request, body))
        return requests

    def _open_path(
        self, model: RunModel, feed: Feed, client: httpx.AsyncClient
    ) -> RustIngest | ReferenceIngest:
        cfg = self.config
        record = (cfg.record, self._header()) if cfg.record is not None else None
        socket = self.socket_path if cfg.mode != "chunk" else None
        if cfg.reconciler == "python":
            return ReferenceIngest(
                model,
                feed,
                client,
                run_id=self.run_id,
                endpoint=cfg.endpoint,
                requests=self._requests(),
                socket_path=socket,
                record=record,
            )
        from .ingest import RustIngest

        ingest = RustIngest(
            model,
            feed,
            run_id=self.run_id,
            endpoint=cfg.endpoint,
            requests=self._requests(),
            api_key=cfg.api_key,
            timeout=cfg.timeout,
            socket_path=socket,
            record=record,
        )
        model.arrival_note = ingest.arrival_note()
        return ingest

    async def run(self) -> SessionResult:
        cfg = self.config
        try:
            reconciler_class(cfg.reconciler)  # a missing extension is a setup error now
        except ReconcilerError as error:
            raise SetupError(str(error)) from None
        client = make_client(cfg.concurrency, cfg.timeout, cfg.api_key)
        view: View | None = None
        path: RustIngest | ReferenceIngest | None = None
        try:
            if self.model_name is None:
                self.model_name = await discover_model(client, cfg.endpoint)
            metrics_before = await fetch_metrics(client, cfg.endpoint)
            streams = [
                StreamState(index=i, mode=cfg.mode, prompt=prompt)
                for i, prompt in enumerate(cfg.prompts)
            ]
            model = RunModel(
                streams=streams,
                mode=cfg.mode,
                backend=detect_backend(cfg.backend, [], metrics_before),
                no_color=cfg.no_color,
                title=self.title,
                simulated=self.simulated,
                reconciler_kind=cfg.reconciler,
            )
            feed = Feed(
                model,
                timeout=cfg.timeout,
                backend_override=cfg.backend,
                metrics_before=metrics_before,
            )
            if cfg.mode == "exact":
                feed.on_failure = lambda _stream: self._abort.set()
            try:
                path = self.path = self._open_path(model, feed, client)
            except ReceiverError as error:
                raise SetupError(str(error)) from None
            view = self.view_factory(model)
            view.start()
            await self._drive(path, model, feed, view)
            model.server_deltas = server_deltas(
                metrics_before, await fetch_metrics(client, cfg.endpoint)
            )
            model.ended_at = time.monotonic()
            model.finished = True
            footer = {
                "verdicts": [[s.verdict, s.reason] for s in model.streams],
                "errors": [s.error for s in model.streams],
                "server_deltas": model.server_deltas,
                "metrics_has_spec_decode": bool(
                    metrics_before is not None and metrics_before.has_spec_decode
                ),
                "wall_seconds": model.ended_at - model.started_at,
            }
            path.close(footer)
            view.stop()
            view = None
            code, message = outcome(model)
            return SessionResult(code, message, model)
        finally:
            if view is not None:
                with contextlib.suppress(Exception):
                    view.abort()
            if path is not None:
                with contextlib.suppress(RecordingError):
                    path.close(None)
            await client.aclose()

    async def _drive(
        self, path: RustIngest | ReferenceIngest, model: RunModel, feed: Feed, view: View
    ) -> None:
        # The Rust path's threads work on their own: Python collects at the
        # render rate. The reference path's socket and streams share this loop.
        interval = view.refresh_interval if self.config.reconciler == "rust" else PUMP_INTERVAL
        path.start()
        last_refresh = 0.0
        while True:
            path.poll()
            if self._abort.is_set() or path.streams_done():
                break
            now = time.monotonic()
            if now - last_refresh >= view.refresh_interval:
                path.update_stats()
                view.refresh()
                last_refresh = now
            await asyncio.sleep(interval)
        if not self._abort.is_set():
            await self._grace(path, feed)
        if self._abort.is_set():
            # exact mode fails closed: the first failure stops every stream that
            # has not been proven or failed on its own.
            for state in model.streams:
                if state.verdict == "pending" and state.error is None:
                    path.cancel(state.index)
            await asyncio.sleep(0)  # let cancelled reference tasks unwind
        path.finalize()
        view.refresh()

    async def _grace(self, path: RustIngest | ReferenceIngest, feed: Feed) -> None:
        if self.config.mode == "chunk":
            return
        deadline = time.monotonic() + (GRACE_SECONDS if self.grace is None else self.grace)
        while time.monotonic() < deadline and not self._abort.is_set():
            path.poll()
            if feed.all_settled():
                return
            await asyncio.sleep(PUMP_INTERVAL)
