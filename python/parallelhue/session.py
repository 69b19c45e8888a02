"""One live run: the socket, the reconciler, the streams, the view, the verdicts.

A run takes one of two paths, chosen by `--reconciler`:
- `rust` (the shipped path, `ingest/native.py`, `RustIngest`): Rust threads do
  every stream's HTTP exchange and read the telemetry socket; the reconciler,
  the `--record` tap and the screen's queue share one lock; Python applies one
  packed batch per refresh to the screen model.
- `python` (the reference path, `ingest/reference.py`, `ReferenceIngest`):
  httpx streams and `PyReceiver` on this event loop feed the pure-Python
  reference reconciler through `RunDriver` (`ingest/driver.py`), which
  `replay` reuses.

`Session` does what both share: model discovery, `/metrics`, the loop that
polls and redraws (`ingest/base.py` says what it needs of a path), exact
mode's fail-closed stop, the grace period for late telemetry, finalize, the
outcome, cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from parallelhue_vllm.paths import (
    SocketPathError,
    default_socket_dir,
    ensure_socket_dir,
    socket_path,
)
from parallelhue_vllm.wire import request_id

from .cli.settings import RunConfig
from .ingest.base import IngestPath, Requests
from .ingest.feed import Feed
from .ingest.metrics import fetch_metrics, server_deltas
from .ingest.receiver import ReceiverError
from .ingest.reconciler import ReconcilerError, reconciler_class
from .ingest.record import RecordingError
from .ingest.reference import ReferenceIngest
from .ingest.request import build_body
from .ingest.schedule import Dispatcher, arrival_offsets
from .ingest.streams import StreamRequest, connect_target, make_client
from .ingest.telemetry import TelemetryError, TelemetryPlan, choose, security_line
from .model.advice import TelemetrySetup, is_this_host
from .model.backend import detect_backend
from .model.endpoint import api_base
from .model.reported import reported_summary
from .model.sanitize import one_line
from .model.shapes import VLLM_PREFIX
from .model.state import RunModel, StreamState, telemetry_expected
from .model.stream_errors import (
    api_key_message,
    connect_reason,
    is_setup_failure,
)
from .screen.views import View

if TYPE_CHECKING:
    from .ingest.native import RustIngest

__all__ = [
    "GRACE_SECONDS",
    "RequestShape",
    "Session",
    "SessionResult",
    "SetupError",
    "outcome",
]

# After the last SSE stream ends, how long late telemetry may still arrive.
GRACE_SECONDS = 2.0
# How often the reference path (and the grace period) look for news.
PUMP_INTERVAL = 0.02
# How long the end of a run waits for datagrams already sent to reach the reconciler.
PENDING_SECONDS = 1.0
# --requests: how soon after a stream ends the next request waiting for it starts.
SLOT_POLL = 0.005


class SetupError(Exception):
    """The run cannot start; one line naming the fix (exit 2)."""


@dataclass  # its RunModel's repr is compact (state.py says why)
class SessionResult:
    exit_code: int
    message: str | None
    model: RunModel


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
            noun = "request" if model.queueing else "stream"  # --requests: some never sent
            plural = f"{noun} was" if cancelled == 1 else f"{noun}s were"
            message += f"; {cancelled} {plural} cancelled because of it"
        return 2, message
    failed = [s for s in streams if s.error is not None]
    if failed:
        first = failed[0]
        # Every stream failed the same way before a byte (the server is down, the key
        # is refused): the run never started, the same setup problem as when model
        # discovery meets it first, and the same exit code.
        setup = model.nothing_received and is_setup_failure(first.error or "")
        return 2 if setup else 1, (
            f"{len(failed)} of {len(streams)} streams failed; "
            f"stream {first.index}: {one_line(first.error or '')}"
        )
    return 0, None


def new_run_id() -> str:
    return secrets.token_hex(16)


def resolve_socket(
    socket_dir: str | None, run_id: str, *, create: bool, shared: bool = False
) -> str:
    """The socket path, checked in every mode; with `create` the directory is
    made (`shared`: 0711, for --accept-uid of a uid other than root)."""
    directory = socket_dir if socket_dir is not None else default_socket_dir()
    try:
        # The length is checked before anything is created: an over-long --socket-dir
        # is an error in every mode and leaves no directory behind.
        # chunk mode and HTTP telemetry bind nothing, but a bad path is still an error.
        path = socket_path(os.path.abspath(directory), run_id)
        if not create:
            return path
        directory = ensure_socket_dir(directory, create=True, shared=shared)
        return socket_path(directory, run_id)
    except SocketPathError as error:
        raise SetupError(str(error)) from None


async def discover_model(client: httpx.AsyncClient, endpoint: str) -> str:
    """The server's only model, from /v1/models."""
    url = api_base(endpoint) + "/models"
    try:
        response = await client.get(url, timeout=30.0)
    except httpx.HTTPError as error:
        # The server is not reachable: --model would not help (the streams would meet it).
        raise SetupError(
            f"cannot list the server's models at {one_line(url)}: {connect_reason(error)}"
        ) from None
    if response.status_code in (401, 403):
        key_given = "Authorization" in client.headers
        raise SetupError(api_key_message(url, key_given, response.status_code))
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


@dataclass(frozen=True)
class RequestShape:
    """One request's own path and body fields, in place of the run's (a run that
    mixes chat and completions, prompts and sampling: tests/vllm/driver.py)."""

    path: str  # on the endpoint's server, e.g. /v1/chat/completions
    fields: Mapping[str, Any]  # replace the run's; give "prompt" or "messages"
    request_id: str | None = None  # None: the run's `ph1_` id (telemetry is for it)


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
        shapes: Sequence[RequestShape] | None = None,
    ) -> None:
        self.config = config
        # Per request (index), in place of the run's path and body fields.
        self.shapes = list(shapes) if shapes is not None else None
        if self.shapes is not None and len(self.shapes) != len(config.prompts):
            raise ValueError(
                f"{len(self.shapes)} request shapes for {len(config.prompts)} requests"
            )
        # Request fields no flag sets (tests: stop strings); None: GRACE_SECONDS.
        self.extra_body = dict(extra_body or {})
        self.grace = grace
        self._telemetry_promised = False  # set once the telemetry path is chosen
        self.view_factory = view_factory
        self.simulated = simulated
        self.title = title
        # Over HTTP telemetry the server's run id takes its place (`_open_path`).
        self.run_id = run_id or new_run_id()
        # Checked now in every mode; the directory is made once the socket is chosen.
        self.socket_path = resolve_socket(config.socket_dir, self.run_id, create=False)
        self.model_name: str | None = config.model
        self._abort = asyncio.Event()
        self.path: RustIngest | ReferenceIngest | None = None
        # The /metrics families before the run (None: the server has no /metrics).
        self._metrics_families: frozenset[str] | None = None

    def _header(self, plan: TelemetryPlan | None, model: RunModel) -> dict[str, Any]:
        cfg = self.config
        return {
            "run_id": self.run_id,
            "telemetry": plan.path if plan is not None else None,
            # What the banner and the fix line said of it, for the replay to say the same.
            "telemetry_line": model.telemetry,
            "telemetry_setup": (
                model.telemetry_setup.as_json() if model.telemetry_setup is not None else None
            ),
            # The /metrics families seen before the run: the replay's backend evidence.
            "metrics_families": (
                sorted(self._metrics_families) if self._metrics_families is not None else None
            ),
            # The reconciler's streams: one per request (--requests), `concurrency` at once.
            "num_streams": len(cfg.prompts),
            "concurrency": cfg.concurrency,
            "request_rate": None if math.isinf(cfg.request_rate) else cfg.request_rate,
            "mode": cfg.mode,
            "backend_override": cfg.backend,
            "simulated": self.simulated,
            "model": self.model_name,
            "max_tokens": cfg.max_tokens,
            "prompts": cfg.prompts,
            "timeout": cfg.timeout,
            "reconciler": cfg.reconciler,
            "stop_strings": model.stop_strings,
            "started_unix": time.time(),
        }

    def _stop_strings(self) -> bool:
        """Whether any request asks for stop strings (--stop, --extra-body, a shape)."""
        bodies: list[Mapping[str, Any]] = [self.config.extra_body, self.extra_body]
        bodies += [shape.fields for shape in self.shapes or ()]
        return bool(self.config.stop) or any(body.get("stop") for body in bodies)

    def _requests(self) -> Requests:
        cfg = self.config
        assert self.model_name is not None
        requests: Requests = []
        for index, prompt in enumerate(cfg.prompts):
            shape = self.shapes[index] if self.shapes is not None else None
            own_id = shape.request_id if shape is not None else None
            request = StreamRequest(
                index=index,
                request_id=own_id or request_id(self.run_id, index),
                prompt=prompt,
                seed=(cfg.seed + index) % 2**32,
                path=shape.path if shape is not None else None,
            )
            body = build_body(cfg, self.model_name, request)
            body.update(self.extra_body)
            if shape is not None:
                body.pop("prompt", None)
                body.pop("messages", None)
                body.update(shape.fields)
            requests.append((request, body))
        return requests

    async def _choose_telemetry(self, client: httpx.AsyncClient) -> TelemetryPlan | None:
        """The run's telemetry path (None in chunk mode); the socket path for the socket."""
        cfg = self.config
        if cfg.mode == "chunk":
            return None
        try:
            plan = await choose(
                client,
                cfg.endpoint,
                cfg.telemetry,
                api_key=cfg.api_key,
                accept_uids=cfg.accept_uids,
            )
        except TelemetryError as error:
            raise SetupError(str(error)) from None
        if plan.path == "socket":
            shared = any(uid not in (0, os.geteuid()) for uid in plan.accept_uids)
            self.socket_path = resolve_socket(
                cfg.socket_dir, self.run_id, create=True, shared=shared
            )
        return plan

    def _new_path(
        self,
        model: RunModel,
        feed: Feed,
        client: httpx.AsyncClient,
        plan: TelemetryPlan | None,
    ) -> RustIngest | ReferenceIngest:
        cfg = self.config
        socket = self.socket_path if plan is not None and plan.path == "socket" else None
        if cfg.reconciler == "python":
            return ReferenceIngest(
                model,
                feed,
                client,
                run_id=self.run_id,
                endpoint=cfg.endpoint,
                telemetry=plan,
                socket_path=socket,
                timeout=cfg.timeout,
            )
        from .ingest.native import RustIngest

        ingest = RustIngest(
            model,
            feed,
            run_id=self.run_id,
            endpoint=cfg.endpoint,
            api_key=cfg.api_key,
            timeout=cfg.timeout,
            telemetry=plan,
            socket_path=socket,
            extra_headers=cfg.headers,
        )
        model.arrival_note = ingest.arrival_note()
        return ingest

    async def _open_path(
        self, path: RustIngest | ReferenceIngest, model: RunModel, plan: TelemetryPlan | None
    ) -> None:
        """The run's id (the server's over HTTP), then the recording, the
        telemetry and the requests composed with that id."""
        cfg = self.config
        try:
            self.run_id = await path.open_run()
        except TelemetryError as error:
            raise SetupError(str(error)) from None
        if plan is not None:
            target = connect_target(cfg.endpoint)
            model.telemetry = security_line(plan, target, cfg.api_key, self.run_id)
            model.telemetry_setup = TelemetrySetup(
                plan.path,
                plan.note,
                remote=not is_this_host(target.host),
                vllm=self._metrics_families is not None
                and any(name.startswith(VLLM_PREFIX) for name in self._metrics_families),
            )
        record = (cfg.record, self._header(plan, model)) if cfg.record is not None else None
        try:
            path.begin(self._requests(), record)
        except (ReceiverError, ReconcilerError) as error:
            raise SetupError(str(error)) from None

    async def run(self) -> SessionResult:
        cfg = self.config
        try:
            reconciler_class(cfg.reconciler)  # a missing extension is a setup error now
        except ReconcilerError as error:
            raise SetupError(str(error)) from None
        # One connection more than streams: the telemetry probe, then its stream.
        client = make_client(cfg.concurrency + 1, cfg.timeout, cfg.api_key, cfg.headers)
        view: View | None = None
        path: RustIngest | ReferenceIngest | None = None
        try:
            if self.model_name is None:
                self.model_name = await discover_model(client, cfg.endpoint)
            metrics_before = await fetch_metrics(client, cfg.endpoint)
            self._metrics_families = metrics_before.families if metrics_before else None
            # Requests that may wait (for a free stream or their arrival time) say so.
            waits = (
                cfg.concurrency < len(cfg.prompts)
                or not math.isinf(cfg.request_rate)
                or cfg.start_delay > 0
            )
            streams = [
                StreamState(index=i, mode=cfg.mode, prompt=prompt, queued=waits)
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
                concurrency=cfg.concurrency,
                request_rate=cfg.request_rate,
                stop_strings=self._stop_strings(),
            )
            feed = Feed(
                model,
                timeout=cfg.timeout,
                backend_override=cfg.backend,
                metrics_before=metrics_before,
            )
            if cfg.mode == "exact":
                feed.on_failure = lambda _stream: self._abort.set()
            plan = await self._choose_telemetry(client)
            # Over HTTP the server's plugin answered: its frames are due even if late.
            self._telemetry_promised = plan is not None and plan.path == "http"
            path = self.path = self._new_path(model, feed, client, plan)
            await self._open_path(path, model, plan)
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
                # Each stream's label and server-reported steps (replay compares them).
                "labels": [s.label for s in model.streams],
                "reported": [reported_summary(s.reported) for s in model.streams],
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
        cfg = self.config
        dispatcher = Dispatcher(
            arrival_offsets(len(model.streams), cfg.request_rate, cfg.seed), cfg.concurrency
        )
        dispatcher.begin(time.monotonic() + cfg.start_delay)  # --start-delay: time to attach
        model.dispatch_at = dispatcher.t0
        for state in model.streams:
            state.scheduled_at = dispatcher.scheduled_at(state.index)
        sent: set[int] = set()  # requests started and not yet seen ending
        last_refresh = 0.0
        while True:
            path.poll()
            self._dispatch(path, model, dispatcher, sent)
            if self._abort.is_set() or (dispatcher.all_started and path.streams_done()):
                break
            now = time.monotonic()
            if now - last_refresh >= view.refresh_interval:
                path.update_stats()
                view.refresh()
                last_refresh = now
            await asyncio.sleep(self._pause(interval, model, dispatcher, sent))
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

    @staticmethod
    def _open_streams(model: RunModel, sent: set[int]) -> int:
        """Requests sent whose exchange is not over (`sent` keeps only those: at
        most --concurrency to look at, however many requests the run has)."""
        sent.difference_update([index for index in sent if model.streams[index].over])
        return len(sent)

    @classmethod
    def _dispatch(
        cls, path: IngestPath, model: RunModel, dispatcher: Dispatcher, sent: set[int]
    ) -> None:
        """Start the requests that are due, while streams are free (schedule.py)."""
        if dispatcher.all_started:
            return
        for index in dispatcher.due(time.monotonic(), cls._open_streams(model, sent)):
            path.start_request(index)
            sent.add(index)

    @classmethod
    def _pause(
        cls, interval: float, model: RunModel, dispatcher: Dispatcher, sent: set[int]
    ) -> float:
        """The loop's sleep: the refresh interval, shorter while requests wait (the
        next arrival time, or SLOT_POLL to see a stream end soon after it does)."""
        if dispatcher.all_started:
            return interval
        wait = dispatcher.wait(time.monotonic(), cls._open_streams(model, sent))
        return min(interval, SLOT_POLL if wait is None else max(wait, 0.0))

    async def _grace(self, path: RustIngest | ReferenceIngest, feed: Feed) -> None:
        if self.config.mode == "chunk":
            return
        path.poll()
        path.update_stats()
        if not self._telemetry_promised and not telemetry_expected(feed.model.counters):
            # Datagrams sent before the streams ended are not late: the receiver
            # thread may not have pushed them yet (a loaded machine).
            settle = time.monotonic() + PENDING_SECONDS
            while path.telemetry_pending() and time.monotonic() < settle:
                await asyncio.sleep(0.001)
            path.poll()
            path.update_stats()
            if not telemetry_expected(feed.model.counters):
                return  # no datagram in the whole run: none is late, none is coming
        deadline = time.monotonic() + (GRACE_SECONDS if self.grace is None else self.grace)
        while time.monotonic() < deadline and not self._abort.is_set():
            path.poll()
            if feed.all_settled():
                return
            await asyncio.sleep(PUMP_INTERVAL)
