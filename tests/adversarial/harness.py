"""Run one transcript through the real client: a `Session` with the plain view.

The client is exactly what `parallelhue` runs (flags parsed by `parse_run`,
the socket and receiver, the HTTP streams and their SSE readers, the chosen
reconciler, the grace period, `finalize()`), in this process; the plain view
writes what a user would see into a string.
"""

from __future__ import annotations

import asyncio
import io
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass

from parallelhue.cli.config import parse_run
from parallelhue.model.state import RunModel
from parallelhue.screen.views import View, make_console, make_view
from parallelhue.session import Session

from .server import LyingServer
from .story import MODEL
from .transcript import Transcript

__all__ = ["Outcome", "run_transcript"]


@dataclass(frozen=True)
class StreamOutcome:
    verdict: str  # exact, failed, pending
    reason: str | None
    label: str
    error: str | None  # the HTTP stream's own failure
    sse_tokens: int  # token ids the client read over SSE
    stats: dict[str, object]  # the reconciler's stream_stats
    uncolored: str  # the characters shown without a step (mixed spans), in order


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    message: str | None  # the one line the CLI prints after the run
    streams: tuple[StreamOutcome, ...]
    screen: str  # everything the plain view printed, and the summary
    run_messages: tuple[str, ...]
    totals: dict[str, object]
    counters: dict[str, int]
    player: dict[str, object]  # what the server sent (for failure messages)

    def describe(self) -> str:
        lines = [f"exit {self.exit_code}: {self.message}"]
        for index, stream in enumerate(self.streams):
            lines.append(
                f"  stream {index}: {stream.verdict} {stream.label} "
                f"reason={stream.reason!r} error={stream.error!r}"
            )
        lines.extend(f"  run: {m}" for m in self.run_messages)
        lines.append(f"  counters: {self.counters}")
        lines.append(f"  player: {self.player}")
        return "\n".join(lines)


class _VerdictProbe:
    """The plain view, telling the server which verdicts the screen shows (AwaitVerdict)."""

    def __init__(self, view: View, model: RunModel, verdicts: dict[int, threading.Event]):
        self._view = view
        self._model = model
        self._verdicts = verdicts
        self.refresh_interval = min(view.refresh_interval, 0.02)

    def _probe(self) -> None:
        for state in self._model.streams:
            if state.verdict != "pending":
                self._verdicts[state.index].set()

    def start(self) -> None:
        self._view.start()

    def refresh(self) -> None:
        self._probe()
        self._view.refresh()

    def stop(self) -> None:
        self._view.stop()

    def abort(self) -> None:
        self._view.abort()


def run_transcript(
    server: LyingServer,
    build: Callable[[str], Transcript],
    *,
    mode: str,
    reconciler: str,
    socket_dir: str,
    record: str | None = None,
) -> Outcome:
    """Build the run's transcript for a fresh run id, play it, return what the client
    did (with `record`, the run is also recorded there, as `--record` does)."""
    run_id = secrets.token_hex(16)
    transcript = build(run_id)
    verdicts = server.register(run_id, transcript, socket_dir)
    argv = [
        "--prompt",
        "tell me a lie",
        "--endpoint",
        server.endpoint(transcript.chat),
        "--model",
        MODEL,
        "--concurrency",
        str(transcript.streams),
        "--max-tokens",
        str(transcript.max_tokens),
        "--mode",
        mode,
        "--reconciler",
        reconciler,
        "--socket-dir",
        socket_dir,
        "--timeout",
        "20",
        "--view",
        "plain",
        *(["--record", record] if record is not None else []),
    ]
    config = parse_run(argv, env={}, stdout_tty=False)
    console = make_console(True, plain=True)
    console.file = io.StringIO()

    def view_factory(model: RunModel) -> View:
        return _VerdictProbe(make_view("plain", model, console), model, verdicts)

    session = Session(config, view_factory, run_id=run_id)
    try:
        result = asyncio.run(session.run())
    finally:
        player = server.forget(run_id)
    model = result.model
    return Outcome(
        exit_code=result.exit_code,
        message=result.message,
        streams=tuple(
            StreamOutcome(
                s.verdict,
                s.reason,
                s.label,
                s.error,
                s.sse_tokens,
                dict(s.stats),
                "".join(text for text, step in s.spans if step is None),
            )
            for s in model.streams
        ),
        screen=console.file.getvalue(),
        run_messages=tuple(model.run_messages),
        totals=dict(model.totals),
        counters=dict(model.counters),
        player=player,
    )
