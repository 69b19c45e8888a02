"""`parallelhue replay FILE`: re-feed a recording into a fresh reconciler and view.

Inputs go to the reconciler in the recorded order, paced by the recorded
times divided by --speed (or without waiting with --speed max). Times shown
in the summary are the recorded ones. At the end the replayed verdicts are
compared with the recorded ones; a difference is reported and exits 1.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from rich.console import Console

from ..ingest.driver import RunDriver
from ..ingest.feed import Feed
from ..ingest.metrics import MetricsSnapshot
from ..ingest.reconciler import ReconcilerError, ReconcilerLike, make_reconciler
from ..ingest.record import SSE_FIELD_KINDS, Recording, RecordingError, read_recording
from ..ingest.streams import StreamStopped
from ..model.advice import TelemetrySetup
from ..model.backend import detect_backend
from ..model.reported import reported_summary
from ..model.sanitize import one_line
from ..model.state import RunModel, StreamState
from ..screen.views import REFRESH_HZ, make_view
from ..session import SetupError, outcome
from .settings import ReplayConfig

__all__ = ["replay"]


def _metrics_evidence(
    header: dict[str, Any], footer: dict[str, Any] | None
) -> MetricsSnapshot | None:
    """Stand-in for the original run's /metrics: the families it had (what the backend
    verdict reads), or in an older recording only whether spec-decode counters existed."""
    families = header.get("metrics_families", False)
    if families is None:
        return None  # the server had no /metrics
    if isinstance(families, list):
        return MetricsSnapshot(samples={}, families=frozenset(str(f) for f in families))
    if footer is None or "metrics_has_spec_decode" not in footer:
        return None
    families = {"vllm:spec_decode_num_drafts"} if footer["metrics_has_spec_decode"] else set()
    return MetricsSnapshot(samples={}, families=frozenset(families))


def _build(recording: Recording, config: ReplayConfig) -> tuple[RunModel, RunDriver]:
    header = recording.header
    try:
        run_id = str(header["run_id"])
        count = int(header["num_streams"])
        mode = str(header["mode"])
    except (KeyError, TypeError, ValueError):
        raise RecordingError("replay: the recording's header is incomplete") from None
    # --requests: `count` requests went out on `concurrency` streams.
    concurrency = int(header.get("concurrency") or count)
    rate = header.get("request_rate")
    if config.view == "stream" and concurrency > 1:
        raise SetupError(
            f"--view stream shows one stream, but the recording has {concurrency}: use --view grid"
        )
    prompts = header.get("prompts") or [""] * count
    reconciler: ReconcilerLike | None = None
    if mode != "chunk":
        try:
            reconciler = make_reconciler(config.reconciler, run_id, count)
        except ReconcilerError as error:
            raise SetupError(str(error)) from None
    override = str(header.get("backend_override", "auto"))
    metrics = _metrics_evidence(header, recording.footer)
    model = RunModel(
        streams=[
            StreamState(
                index=i,
                mode=mode,
                prompt=str(prompts[i] if i < len(prompts) else ""),
                queued=concurrency < count or rate is not None,
            )
            for i in range(count)
        ],
        mode=mode,
        backend=detect_backend(override, [], metrics),
        no_color=config.no_color,
        title="ParallelHue replay",
        simulated=bool(header.get("simulated", False)),
        reconciler_kind=config.reconciler,
        concurrency=concurrency,
        request_rate=float(rate) if isinstance(rate, int | float) else math.inf,
        stop_strings=bool(header.get("stop_strings", False)),
    )
    model.started_at = 0.0
    model.replay_of = config.path
    model.color_by = config.color_by
    model.palette = config.palette
    model.model_name = str(header["model"]) if header.get("model") else None
    # The live run's telemetry line and setup: the banner and the fix line say the same.
    model.telemetry = one_line(str(header.get("telemetry_line") or ""), 300)
    model.telemetry_setup = TelemetrySetup.from_json(header.get("telemetry_setup"))
    timeout = float(header.get("timeout", 60.0))
    feed = Feed(model, timeout=timeout, backend_override=override, metrics_before=metrics)
    driver = RunDriver(model, feed, reconciler)
    return model, driver


def _apply(driver: RunDriver, event: tuple[Any, ...]) -> bool:
    """Feed one recorded input; True when it was the finalize call."""
    kind = event[1]
    if kind == "start":
        driver.start(int(event[2]))
    elif kind == "sse":
        stream = int(event[2])
        try:
            driver.on_delta(stream, str(event[3]), [int(t) for t in event[4]])
        except StreamStopped:
            pass  # failed as in the live run; its reason is on the model
        except Exception as error:  # as the live run's reader did: this stream only
            driver.on_end(stream, "internal", 0, f"{type(error).__name__}: {error}")
    elif kind in SSE_FIELD_KINDS:
        stream = int(event[2])
        try:
            driver.on_sse_input(stream, tuple(event[1:]))
        except StreamStopped:
            pass  # failed as in the live run; its reason is on the model
    elif kind == "finish":
        driver.on_finish(int(event[2]), event[3])
    elif kind == "end":
        driver.on_end(int(event[2]), event[3], int(event[4]), str(event[5]))
    elif kind == "frame":
        driver.frames([bytes(event[2])])
    elif kind == "reject":
        # A datagram refused before decoding (oversized): a run message, no input.
        driver.feed.run_message(f"rejected frame: {event[2]}")
    elif kind == "lost":
        frames = None if event[2] is None else int(event[2])
        driver.lost(frames)
    elif kind == "stream_lost":
        driver.stream_lost(int(event[2]), str(event[3]))
    elif kind == "finalize":
        driver.finalize()
        return True
    return False


def _verdict(verdict: object, reason: object) -> str:
    return f"{verdict} ({one_line(str(reason))})" if reason else str(verdict)


def _compare(path: str, model: RunModel, footer: dict[str, Any] | None) -> str | None:
    if footer is None or "verdicts" not in footer:
        return (
            f"replay: {one_line(path)} has no footer (the recorded run was interrupted or the "
            "file is cut short): the replayed verdicts could not be compared with the recording"
        )
    if len(footer["verdicts"]) != len(model.streams):
        return (
            f"replay differs from the recording: its footer has {len(footer['verdicts'])} "
            f"verdicts for {len(model.streams)} streams"
        )
    for state, recorded in zip(model.streams, footer["verdicts"], strict=True):
        if [state.verdict, state.reason] != list(recorded):
            return (
                f"replay differs from the recording: stream {state.index} was "
                f"{_verdict(*recorded)}, replayed {_verdict(state.verdict, state.reason)}"
            )
    # The label of each stream and its server-reported steps, judged again from the
    # recorded inputs (a recording without them: nothing to compare).
    for state, label in zip(model.streams, footer.get("labels") or [], strict=False):
        if state.label != label:
            return (
                f"replay differs from the recording: stream {state.index} was {label}, "
                f"replayed {state.label}"
            )
    for state, recorded in zip(model.streams, footer.get("reported") or [], strict=False):
        replayed = reported_summary(state.reported)
        if replayed != recorded:
            return (
                f"replay differs from the recording: stream {state.index}'s server-reported "
                f"steps were {recorded}, replayed {replayed}"
            )
    return None


async def replay(config: ReplayConfig, console: Console) -> tuple[int, str | None, RunModel, Any]:
    recording = read_recording(config.path)
    model, driver = _build(recording, config)
    now = [0.0]
    driver.clock = lambda: now[0]
    view = make_view(config.view, model, console)
    view.start()
    finalized = False
    completed = False
    try:
        wall_start = time.monotonic()
        last_refresh = 0.0
        for event in recording.events:
            try:
                at = float(event[0])
                if not math.isinf(config.speed):
                    delay = wall_start + at / config.speed - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                now[0] = at
                finalized = _apply(driver, event) or finalized
            except (IndexError, TypeError, ValueError):
                raise RecordingError(
                    f"replay: malformed {str(event[1])[:20]} event at t={event[0]}"
                ) from None
            driver.apply_events()
            if time.monotonic() - last_refresh >= 1.0 / REFRESH_HZ:
                driver.update_stats()
                view.refresh()
                last_refresh = time.monotonic()
        if not finalized:
            driver.finalize()
        driver.apply_events()
        driver.update_stats()
        footer = recording.footer or {}
        model.server_deltas = [(str(k), float(v)) for k, v in footer.get("server_deltas", [])]
        wall = footer.get("wall_seconds")
        model.ended_at = float(wall) if isinstance(wall, int | float) else now[0]
        model.finished = True
        completed = True
    finally:
        if completed:
            view.stop()
        else:
            view.abort()
    mismatch = _compare(config.path, model, recording.footer)
    if mismatch is not None:
        return 1, mismatch, model, view
    code, message = outcome(model)
    return code, message, model, view
