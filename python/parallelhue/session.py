"""One run: the socket, the reconciler, the streams, the view, the verdicts.

`RunDriver` holds the run's state and is the only place inputs reach the
reconciler (so a recording captures them in order, and replay reuses it).
`Session` adds the live parts: socket directory and receiver, the HTTP
streams, the refresh task, the grace period for late telemetry and cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
from .metrics import MetricsSnapshot, fetch_metrics, server_deltas
from .receiver import FrameSource, NativeReceiver, PyReceiver, ReceiverError
from .reconciler import ReconcilerError, ReconcilerLike, make_reconciler
from .record import Recorder
from .sanitize import one_line
from .state import RunModel, StreamState
from .stream_reader import NativeStreamReader
from .streams import (
    StreamRequest,
    build_body,
    connect_reason,
    make_client,
    native_parser_factory,
    run_stream,
)
from .views import View

__all__ = ["GRACE_SECONDS", "RunDriver", "Session", "SessionResult", "SetupError", "outcome"]

# After the last SSE stream ends, how long late telemetry may still arrive.
GRACE_SECONDS = 2.0
PUMP_INTERVAL = 0.02


class SetupError(Exception):
    """The run cannot start; one line naming the fix (exit 2)."""


@dataclass  # its RunModel's repr is compact (state.py says why)
class SessionResult:
    exit_code: int
    message: str | None
    model: RunModel


class RunDriver:
    """Feeds the reconciler and the screen model; records every input in order."""

    def __init__(
        self,
        model: RunModel,
        reconciler: ReconcilerLike | None,
        recorder: Recorder | None = None,
        backend_override: str = "auto",
        metrics_before: MetricsSnapshot | None = None,
    ) -> None:
        self.model = model
        self.reconciler = reconciler
        self.recorder = recorder
        self.backend_override = backend_override
        self.metrics_before = metrics_before
        self.on_failure: Callable[[int], None] | None = None
        # The replayer swaps in the recording's clock so times match the original run;
        # a recorded run uses the recorder's clock so both hold the same numbers.
        self.clock: Callable[[], float] = recorder.clock if recorder else time.monotonic

    # --- inputs (StreamSink) ------------------------------------------------------

    def start(self, stream: int) -> None:
        now = self.clock()
        self.model.streams[stream].started_at = now
        if self.recorder is not None:
            self.recorder.start(now, stream)

    def on_delta(self, stream: int, text: str, token_ids: list[int]) -> None:
        now = self.clock()
        self.model.streams[stream].add_delta(text, token_ids, now)
        if self.recorder is not None:
            self.recorder.sse(now, stream, text, token_ids)
        if self.reconciler is not None:
            try:
                self.reconciler.push_sse(stream, text, token_ids)
            except ValueError as error:  # e.g. a token id outside u32
                self.on_error(stream, f"invalid SSE data: {one_line(str(error))}")

    def on_reads(
        self, stream: int, texts: list[str], times: list[float], tokens: int, text_bytes: int
    ) -> None:
        """Deltas the Rust SSE thread read and already pushed into the reconciler
        (never while recording: a recording needs each input in order, via `on_delta`)."""
        self.model.streams[stream].add_reads(texts, times, tokens, text_bytes)

    def on_finish(self, stream: int, finish_reason: str) -> None:
        state = self.model.streams[stream]
        state.sse_finished = True
        state.finish_reason = finish_reason
        if self.recorder is not None:
            self.recorder.finish(self.clock(), stream, finish_reason)
        if self.reconciler is not None:
            self.reconciler.finish_sse(stream)

    def on_error(self, stream: int, message: str) -> None:
        self.model.streams[stream].fail_http(message)
        if self.recorder is not None:
            self.recorder.error(self.clock(), stream, message)
        if self.on_failure is not None:
            self.on_failure(stream)

    def on_usage(self, stream: int, usage: dict[str, Any]) -> None:
        self.model.streams[stream].usage = usage

    def frames(self, frames: list[bytes]) -> None:
        if not frames or self.reconciler is None:
            return
        if self.recorder is not None:
            self.recorder.frames(self.clock(), frames)
        self.reconciler.push_frames(frames)

    def finalize(self) -> None:
        if self.reconciler is None:
            return
        if self.recorder is not None:
            self.recorder.finalize(self.clock())
        self.reconciler.finalize()
        self.apply_events()
        self.update_stats()

    # --- outputs -------------------------------------------------------------------

    def apply_events(self) -> None:
        if self.reconciler is None:
            return
        streams = self.model.streams
        for event in self.reconciler.drain():
            kind = event[0]
            if kind == "span":
                _, stream, byte_start, text, step_index, _first, _count = event
                streams[stream].add_span(int(byte_start), str(text), step_index)
            elif kind == "exact":
                streams[event[1]].verdict = "exact"
            elif kind == "failed":
                state = streams[event[1]]
                state.verdict = "failed"
                state.reason = str(event[2])
                if self.on_failure is not None:
                    self.on_failure(event[1])
            elif kind == "run":
                self.model.run_messages.append(one_line(str(event[1])))

    def update_stats(self) -> None:
        reconciler = self.reconciler
        if reconciler is None:
            return
        for state in self.model.streams:
            state.stats = dict(reconciler.stream_stats(state.index))
        self.model.totals = dict(reconciler.totals())
        self.model.counters = {str(k): int(v) for k, v in reconciler.counters().items()}
        sources = [dict(source) for source in reconciler.sources()]
        if len(sources) != len(self.model.sources):
            self.model.sources = sources
            self.update_backend(sources)

    def update_backend(self, sources: list[dict[str, Any]]) -> None:
        self.model.backend = detect_backend(self.backend_override, sources, self.metrics_before)

    def all_settled(self) -> bool:
        """Every stream that can still get a verdict has one."""
        return all(s.verdict != "pending" or s.error is not None for s in self.model.streams)


def outcome(model: RunModel) -> tuple[int, str | None]:
    """Exit code and one-line message for a finished run."""
    streams = model.streams
    if model.mode == "exact":
        for state in streams:
            if state.verdict != "exact":
                why = state.error or state.reason or "no verdict"
                return 2, f"exact mode: stream {state.index} is not exact: {one_line(why)}"
        return 0, None
    failed = [s for s in streams if s.error is not None]
    if failed:
        first = failed[0]
        return 1, (
            f"{len(failed)} of {len(streams)} streams failed; "
            f"stream {first.index}: {one_line(first.error or '')}"
        )
    return 0, None


def _collect(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


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
    ) -> None:
        self.config = config
        self.view_factory = view_factory
        self.simulated = simulated
        self.title = title
        self.run_id = run_id or new_run_id()
        self.socket_path = resolve_socket(config.mode, config.socket_dir, self.run_id)
        self.model_name: str | None = config.model
        self._abort = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._stream_reader: NativeStreamReader | None = None

    def _recorder(self) -> Recorder | None:
        cfg = self.config
        if cfg.record is None:
            return None
        return Recorder(
            cfg.record,
            {
                "run_id": self.run_id,
                "num_streams": cfg.concurrency,
                "mode": cfg.mode,
                "backend_override": cfg.backend,
                "simulated": self.simulated,
                "model": self.model_name,
                "max_tokens": cfg.max_tokens,
                "prompts": cfg.prompts,
                "started_unix": time.time(),
            },
        )

    async def run(self) -> SessionResult:
        cfg = self.config
        reconciler: ReconcilerLike | None = None
        if cfg.mode != "chunk":
            try:
                reconciler = make_reconciler(cfg.reconciler, self.run_id, cfg.concurrency)
            except ReconcilerError as error:
                raise SetupError(str(error)) from None

        client = make_client(cfg.concurrency, cfg.timeout, cfg.api_key)
        receiver: FrameSource | None = None
        recorder: Recorder | None = None
        view: View | None = None
        model: RunModel | None = None
        try:
            if self.model_name is None:
                self.model_name = await discover_model(client, cfg.endpoint)
            metrics_before = await fetch_metrics(client, cfg.endpoint)
            if reconciler is not None:
                try:
                    if cfg.reconciler == "rust" and cfg.record is None:
                        receiver = NativeReceiver(self.socket_path, reconciler)
                    else:
                        receiver = PyReceiver(self.socket_path)
                except ReceiverError as error:
                    raise SetupError(str(error)) from None
            recorder = self._recorder()
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
            driver = RunDriver(model, reconciler, recorder, cfg.backend, metrics_before)
            if cfg.mode == "exact":
                driver.on_failure = lambda _stream: self._abort.set()
            view = self.view_factory(model)
            view.start()
            await self._drive(client, driver, receiver, view)
            model.server_deltas = server_deltas(
                metrics_before, await fetch_metrics(client, cfg.endpoint)
            )
            model.ended_at = time.monotonic()
            model.finished = True
            if recorder is not None:
                recorder.close(
                    {
                        "verdicts": [[s.verdict, s.reason] for s in model.streams],
                        "errors": [s.error for s in model.streams],
                        "server_deltas": model.server_deltas,
                        "metrics_has_spec_decode": bool(
                            metrics_before is not None and metrics_before.has_spec_decode
                        ),
                        "wall_seconds": model.ended_at - model.started_at,
                    }
                )
                recorder = None
            view.stop()
            view = None
            code, message = outcome(model)
            return SessionResult(code, message, model)
        finally:
            for task in self._tasks:
                task.cancel()
            if self._stream_reader is not None:
                self._stream_reader.close()
            if view is not None:
                with contextlib.suppress(Exception):
                    view.abort()
            if recorder is not None:
                recorder.abandon()
            if receiver is not None:
                receiver.close()
            await client.aclose()

    async def _drive(
        self,
        client: httpx.AsyncClient,
        driver: RunDriver,
        receiver: FrameSource | None,
        view: View,
    ) -> None:
        cfg = self.config
        assert self.model_name is not None
        # The Rust SSE parser goes with the Rust reconciler; --reconciler python parses
        # SSE in Python (the reference path). A socket read from this loop needs the
        # readers to yield after every read.
        parser_factory = native_parser_factory() if cfg.reconciler == "rust" else None
        yield_each_read = isinstance(receiver, PyReceiver)
        # The Rust SSE thread pushes deltas into the Rust reconciler itself, so it
        # needs that reconciler and no recorder (which must see every input).
        if parser_factory is not None and driver.recorder is None:
            self._stream_reader = NativeStreamReader.create(driver.reconciler, driver)
            if self._stream_reader is not None:
                driver.model.arrival_note = self._stream_reader.arrival_note()
        stream_tasks: list[asyncio.Task[None]] = []
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
            driver.start(index)
            stream_tasks.append(
                asyncio.create_task(
                    run_stream(
                        client,
                        cfg.endpoint,
                        body,
                        request,
                        driver,
                        cfg.timeout,
                        parser_factory=parser_factory,
                        yield_each_read=yield_each_read,
                        stream_reader=self._stream_reader,
                    )
                )
            )
        pump = asyncio.create_task(self._pump(driver, receiver))
        refresher = asyncio.create_task(self._refresh(driver, view))
        self._tasks = [*stream_tasks, pump, refresher]

        all_streams: asyncio.Future[Any] = asyncio.gather(*stream_tasks)
        # On Ctrl-C the streams are cancelled from outside; collect that quietly.
        all_streams.add_done_callback(_collect)
        abort_wait: asyncio.Task[Any] = asyncio.create_task(self._abort.wait())
        self._tasks.append(abort_wait)
        await asyncio.wait([all_streams, abort_wait], return_when=asyncio.FIRST_COMPLETED)
        if self._abort.is_set():
            # exact mode fails closed: the first failure stops every stream.
            for task in stream_tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await all_streams
        else:
            abort_wait.cancel()
            await self._grace(driver, receiver)
        pump.cancel()
        if receiver is not None:
            driver.frames(receiver.take())
        driver.apply_events()
        driver.finalize()
        refresher.cancel()
        view.refresh()

    async def _grace(self, driver: RunDriver, receiver: FrameSource | None) -> None:
        if driver.reconciler is None:
            return
        deadline = time.monotonic() + GRACE_SECONDS
        while time.monotonic() < deadline and not self._abort.is_set():
            if receiver is not None:
                driver.frames(receiver.take())
            driver.apply_events()
            if driver.all_settled():
                return
            await asyncio.sleep(PUMP_INTERVAL)

    async def _pump(self, driver: RunDriver, receiver: FrameSource | None) -> None:
        while True:
            if receiver is not None:
                driver.frames(receiver.take())
            driver.apply_events()
            await asyncio.sleep(PUMP_INTERVAL)

    async def _refresh(self, driver: RunDriver, view: View) -> None:
        while True:
            driver.update_stats()
            view.refresh()
            await asyncio.sleep(view.refresh_interval)
