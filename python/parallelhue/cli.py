"""The `parallelhue` command: a run, `demo`, `replay`, and help.

Exit codes: 0 success; 1 some streams failed over HTTP (the rest completed);
2 bad input, a setup problem, or an exact-mode run that is not exact;
130 interrupted. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
from collections.abc import Sequence

from rich.console import Console

from .config import (
    ConfigError,
    DemoConfig,
    ReplayConfig,
    RunConfig,
    parse_demo,
    parse_replay,
    parse_run,
)
from .export import ExportError, export_picture
from .measurement import MeasurementError, write_measurement
from .record import RecordingError
from .sanitize import one_line
from .session import Session, SessionResult, SetupError
from .state import RunModel
from .tmux import TmuxError
from .views import View, make_console, make_view

__all__ = ["main"]

USAGE = """\
usage: parallelhue [PROMPT] [options]          stream PROMPT from an OpenAI-compatible server
       parallelhue demo [options]              the same, against the embedded SIMULATED engine
       parallelhue replay FILE [options]       re-render a --record file with a fresh reconciler

options (environment variable in brackets; flags win):
  --endpoint URL        .../v1/chat/completions or .../v1/completions
                        [PARALLELHUE_ENDPOINT] (default http://127.0.0.1:8000/v1/chat/completions)
  --model NAME          [PARALLELHUE_MODEL] (default: the server's only model from /v1/models)
  --prompt TEXT         [PARALLELHUE_PROMPT] one prompt, sent on every stream
  --prompt-file FILE    [PARALLELHUE_PROMPT_FILE] one prompt per line (or a .json list);
                        stream i gets prompt i mod N; --concurrency defaults to N
  --max-tokens N        [PARALLELHUE_MAX_TOKENS] (default 128)
  --concurrency N       [PARALLELHUE_CONCURRENCY] streams, 1-64 shown (default 1)
  --api-key KEY         [PARALLELHUE_API_KEY, OPENAI_API_KEY]
  --mode MODE           [PARALLELHUE_MODE] auto (default) | exact | chunk
  --telemetry WAY       [PARALLELHUE_TELEMETRY] auto (default: the server's HTTP route when
                        its plugin answers, else the socket) | socket | http
  --socket-dir DIR      [PARALLELHUE_SOCKET_DIR] telemetry socket directory
                        (default $XDG_RUNTIME_DIR/parallelhue, else <tmp>/parallelhue-<uid>)
  --accept-uid UID      [PARALLELHUE_ACCEPT_UIDS=UID,...] also admit socket frames from UID
                        (a server in a container on this host); repeatable
  --timeout SECONDS     [PARALLELHUE_TIMEOUT] longest silence inside a stream (default 60)
  --backend NAME        [PARALLELHUE_BACKEND] auto (default: from evidence) | generic | a
                        speculative method (ngram, draft_model, eagle3, mtp, ...) declared by you
  --temperature T       [PARALLELHUE_TEMPERATURE] (default: the server's)
  --seed N              [PARALLELHUE_SEED] stream i uses seed N+i (default 0)
  --view VIEW           [PARALLELHUE_VIEW] stream | grid | plain (default: stream for one
                        stream, grid for more, plain when stdout is not a terminal)
  --tmux [--no-attach]  one tmux pane per stream plus a summary pane
  --record FILE         write the run (SSE events, frames, timings) to FILE (gzip'd JSON lines)
  --export FILE         FILE.svg or FILE.html picture of the final grid and summary
  --measurement FILE    JSON measurement record (see docs/MEASUREMENTS.md)
  --reconciler KIND     [PARALLELHUE_RECONCILER] rust (default) | python (reference)
demo options: --concurrency (default 16, max 64) --acceptance A --draft-len K --step-ms S
              --fault SPEC (inject faults, e.g. drop:1,max-per-fault:1; docs/SIMULATOR.md)
              --max-tokens --view --mode --seed --prompt --record --export --measurement
              --telemetry socket (default) | http (the engine serves its HTTP route)
replay options: --speed X (default 1; 'max' for no waiting) --view --export --reconciler
NO_COLOR=1 turns colors off. Labels: EXACT TOKEN PROVENANCE (proven by telemetry),
SSE CHUNK MODE (colors follow SSE chunks, not engine steps).
"""


def _error(message: str) -> int:
    print(f"parallelhue: error: {one_line(message, 400)}", file=sys.stderr)
    return 2


def _console_for(view: str, no_color: bool) -> Console:
    return make_console(no_color, plain=(view == "plain"))


def _finish(result: SessionResult, config: RunConfig, model_name: str | None, view: object) -> int:
    model = result.model
    if config.export is not None:
        export_picture(config.export, model, view)  # type: ignore[arg-type]
    if config.measurement is not None:
        write_measurement(config.measurement, model, config, model_name)
    if result.message:
        print(f"parallelhue: {result.message}", file=sys.stderr)
    return result.exit_code


class _ViewHolder:
    """Remembers the view the session built, for --export afterwards."""

    def __init__(self, kind: str, console: Console, config: RunConfig) -> None:
        self.kind = kind
        self.console = console
        self.config = config
        self.view: object = None

    def __call__(self, model: RunModel) -> View:
        view: View
        if self.config.tmux:
            from .tmux import TmuxView

            view = TmuxView(model, self.console, attach=not self.config.no_attach)
        else:
            view = make_view(self.kind, model, self.console)
        self.view = view
        return view


def _run(config: RunConfig, *, simulated: bool = False) -> int:
    for warning in config.warnings:
        print(f"parallelhue: warning: {warning}", file=sys.stderr)
    console = _console_for(config.view, config.no_color)
    holder = _ViewHolder(config.view, console, config)
    session = Session(config, holder, simulated=simulated)
    result = asyncio.run(session.run())
    return _finish(result, config, session.model_name, holder.view)


async def _demo_async(demo: DemoConfig, holder: _ViewHolder) -> tuple[SessionResult, Session]:
    from .session import new_run_id, resolve_socket
    from .sim import FaultConfig, SimConfig, SimServer

    run = demo.run
    # The simulated engine's emitters share this process: their warnings (e.g. frames
    # dropped once Ctrl-C has removed the socket) would only repeat what the client
    # itself proves or reports from the frames' `dropped` counts.
    logging.getLogger("parallelhue_vllm").setLevel(logging.ERROR)
    # The same checks as a live run (length first, then the 0700 directory).
    socket = run.telemetry != "http"
    directory = os.path.dirname(resolve_socket(run.socket_dir, new_run_id(), create=socket))
    sim_config = SimConfig(
        draft_len=demo.draft_len,
        acceptance=demo.acceptance,
        step_ms=demo.step_ms,
        seed=run.seed,
        socket_dir=directory,
        faults=FaultConfig.parse(demo.faults) if demo.faults else None,
        # --telemetry http: the engine serves the route only; auto: both ways, the client picks.
        telemetry_mode={"socket": "socket", "http": "http"}.get(run.telemetry, "both"),
    )
    server = SimServer(sim_config)
    url = await server.start()
    try:
        config = dataclasses.replace(
            run, endpoint=url + "/v1/chat/completions", socket_dir=directory
        )
        holder.config = config
        session = Session(config, holder, simulated=True, title="ParallelHue demo")
        return await session.run(), session
    finally:
        await server.stop()


def _demo(demo: DemoConfig) -> int:
    run = demo.run
    console = _console_for(run.view, run.no_color)
    holder = _ViewHolder(run.view, console, run)
    result, session = asyncio.run(_demo_async(demo, holder))
    return _finish(result, holder.config, session.model_name, holder.view)


def _replay(config: ReplayConfig) -> int:
    from .replay import replay

    console = _console_for(config.view, config.no_color)
    code, message, model, view = asyncio.run(replay(config, console))
    if config.export is not None:
        export_picture(config.export, model, view)
    if message:
        print(f"parallelhue: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] in ("-h", "--help", "help"):
            print(USAGE, end="")
            return 0
        if args and args[0] == "--version":
            from parallelhue import __version__

            print(f"parallelhue {__version__}")
            return 0
        if args and args[0] == "_tmux-pane":
            from .tmux import pane_main

            return int(pane_main(args[1:]))
        if args and args[0] == "demo":
            return _demo(parse_demo(args[1:]))
        if args and args[0] == "replay":
            return _replay(parse_replay(args[1:]))
        if any(a in ("-h", "--help") for a in args):
            print(USAGE, end="")
            return 0
        return _run(parse_run(args))
    except (
        ConfigError,
        SetupError,
        RecordingError,
        ExportError,
        MeasurementError,
        TmuxError,
    ) as error:
        return _error(str(error))
    except KeyboardInterrupt:
        print("parallelhue: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        # A bug, not bad input: still one line (PARALLELHUE_DEBUG=1 shows the traceback).
        if os.environ.get("PARALLELHUE_DEBUG"):
            raise
        print(
            f"parallelhue: internal error: {type(error).__name__}: {one_line(str(error))} "
            "(rerun with PARALLELHUE_DEBUG=1 for details)",
            file=sys.stderr,
        )
        return 1
