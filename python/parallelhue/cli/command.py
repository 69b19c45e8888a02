"""The `parallelhue` command: a run, `demo`, `replay`, and help.

Exit codes: 0 success; 1 some streams failed over HTTP (the rest completed),
or a replay that differs from (or cannot be compared with) its recording;
2 bad input, a setup problem, or an exact-mode run that is not exact;
130 interrupted (Ctrl-C or q); 141 stdout was closed (e.g. `| head`).
Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from ..ingest.record import RecordingError
from ..model.endpoint import display_server
from ..model.results import json_document
from ..model.sanitize import one_line
from ..model.state import RunModel
from ..screen.export import ExportError, export_picture
from ..screen.measurement import MeasurementError, write_measurement
from ..screen.tmux import TmuxError
from ..screen.views import View, make_console, make_view, print_summary
from ..session import Session, SessionResult, SetupError
from .config import ConfigError, parse_replay, parse_run
from .settings import (
    HARD_CONCURRENCY_LIMIT,
    MAX_CONCURRENCY,
    MAX_REQUESTS,
    STDOUT,
    RunConfig,
)

__all__ = ["main"]

USAGE = f"""\
usage: parallelhue [PROMPT] [options]          stream PROMPT from an OpenAI-compatible server
       parallelhue demo [options]              the same, against the embedded SIMULATED engine
       parallelhue replay FILE [options]       re-render a --record file with a fresh reconciler

server (environment variable in brackets; flags win):
  --endpoint URL        a base URL as the OpenAI SDK takes it (http://host:8000, .../v1) or a
                        full .../v1/chat/completions or .../v1/completions URL
                        [PARALLELHUE_ENDPOINT, then OPENAI_BASE_URL]
                        (default http://127.0.0.1:8000/v1)
  --api chat|completions  which API a base URL gets [PARALLELHUE_API] (default chat)
  --model NAME          [PARALLELHUE_MODEL] (default: the server's only model from /v1/models)
  --api-key KEY         [OPENAI_API_KEY, then PARALLELHUE_API_KEY]
  --header 'K: V'       an extra HTTP header on every request (repeatable)
  --timeout SECONDS     [PARALLELHUE_TIMEOUT] longest silence inside a stream (default 60)
requests:
  --prompt TEXT         [PARALLELHUE_PROMPT] one prompt, sent on every stream
  --prompt-file FILE    [PARALLELHUE_PROMPT_FILE] one prompt per line (or a .json list);
                        request i gets prompt i mod N; --concurrency defaults to N
  --concurrency N       [PARALLELHUE_CONCURRENCY] streams, 1-{HARD_CONCURRENCY_LIMIT} (default 1);
                        the first {MAX_CONCURRENCY} get panes, the rest overview lines
  --requests N          [PARALLELHUE_REQUESTS] requests in the run, 1-{MAX_REQUESTS} (default: one
                        per stream); more than --concurrency: each stream sends the next
                        request when its last one ends (a pane shows a stream's latest, #i/N)
  --request-rate R      [PARALLELHUE_REQUEST_RATE] requests per second, Poisson arrivals drawn
                        from --seed (default inf: each as soon as a stream is free)
  --max-tokens N        [PARALLELHUE_MAX_TOKENS] (default 128)
  --temperature T       [PARALLELHUE_TEMPERATURE] (default 0.8; 0 with --force-full-length)
  --seed N              [PARALLELHUE_SEED] request i uses seed N+i (default 0)
  --frequency-penalty F, --presence-penalty P  [PARALLELHUE_FREQUENCY_PENALTY,
                        PARALLELHUE_PRESENCE_PENALTY] -2 to 2 (default: not sent)
  --repeat-penalty R    [PARALLELHUE_REPEAT_PENALTY] llama.cpp's repeat_penalty (default: not sent)
  --stop TEXT           a stop string (repeatable)
  --ignore-eos          keep generating past the end-of-sequence token (vLLM)
  --force-full-length   [PARALLELHUE_FORCE_FULL_LENGTH=1] every stream runs to --max-tokens
                        (ignore_eos, min_tokens) at temperature 0 unless given
  --start-delay S       [PARALLELHUE_START_DELAY] wait S seconds after the screen is up
                        before the first request (time to attach to --tmux)
  --system TEXT         a system message before the prompt (chat API)
  --extra-body JSON     more request fields, e.g. '{{"top_p": 0.9}}'
verification:
  --mode MODE           [PARALLELHUE_MODE] auto (default) | exact | chunk
  --backend NAME        [PARALLELHUE_BACKEND] auto (default: from evidence) | generic | a
                        speculative method (ngram, draft_model, eagle3, mtp, ...) declared by you
  --telemetry WAY       [PARALLELHUE_TELEMETRY] auto (default: the server's HTTP route when
                        its plugin answers, else the socket) | socket | http
  --socket-dir DIR      [PARALLELHUE_SOCKET_DIR] telemetry socket directory
                        (default $XDG_RUNTIME_DIR/parallelhue, else <tmp>/parallelhue-<uid>)
  --accept-uid UID      [PARALLELHUE_ACCEPT_UIDS=UID,...] also admit socket frames from UID
                        (a server in a container on this host); repeatable
  --reconciler KIND     [PARALLELHUE_RECONCILER] rust (default) | python (reference)
screen and outputs:
  --view VIEW           [PARALLELHUE_VIEW] stream | grid | plain (default: stream for one
                        stream, grid for more, plain when stdout is not a terminal or TERM=dumb)
  --color step|role     [PARALLELHUE_COLOR] color by engine step (default) or by token role
  --palette NAME        [PARALLELHUE_PALETTE] standard (default) | colorblind (Okabe-Ito)
  --tmux [--no-attach]  one tmux pane per stream plus a summary pane (without tmux on PATH:
                        a warning, and the run shows here); --no-tmux cancels --tmux
  --json                the summary and per-stream results as JSON on stdout (screen: stderr)
  --record FILE         write the run (SSE inputs, frames, timings) to FILE: recording
                        format 3 (gzip'd binary items); parallelhue replay FILE re-renders it
  --export FILE         FILE.svg or FILE.html (with plots) picture of the final grid and summary
  --measurement FILE    JSON measurement record, - for stdout (see docs/MEASUREMENTS.md)
keys in the grid and stream views: arrows/Tab/hjkl focus, z or Enter zoom, Esc back,
  p or space pause the screen (the run goes on), c step/role colors, q quit (like Ctrl-C)
"""

DEMO_USAGE = """\
usage: parallelhue demo [options]
A normal session against the embedded SIMULATED engine: every number it shows is
simulated, and says so.

the simulated engine:
  --concurrency N       streams, 1-64 (default 16)
  --max-tokens N        tokens per stream (default 256)
  --step-ms S           milliseconds per engine step (default 80: about 15 s to watch)
  --draft-len K         drafts per step, 1-16 (default 4)
  --acceptance A        draft acceptance 0-1 (default: a spread over the streams)
  --fault SPEC          faults to watch, comma-separated NAME[:VALUE], e.g.
                          sse-byte,target-stream:2     one stream downgrades
                          drop:1,max-per-fault:1       with --mode exact: it fails closed
                        NAME: {faults}
the run (as in parallelhue --help):
  --mode --view --seed --prompt --requests --request-rate --stop --ignore-eos
  --system --extra-body --header --color --palette --json --record --export
  --measurement --reconciler --tmux --no-attach --start-delay, and
  --telemetry socket (default) | http (the engine serves its HTTP route) | auto
"""


def demo_usage() -> str:
    """DEMO_USAGE with the simulator's fault names (read from its FaultConfig)."""
    import dataclasses
    import textwrap

    from ..sim import FaultConfig

    names = sorted(
        "delay" if f.name == "delay_ms" else f.name.replace("_", "-")
        for f in dataclasses.fields(FaultConfig)
    )
    wrapped = textwrap.wrap(", ".join(names), 62, break_on_hyphens=False)
    return DEMO_USAGE.format(faults=("\n" + " " * 24).join(wrapped))


REPLAY_USAGE = """\
usage: parallelhue replay FILE [options]
Re-feeds a --record file into a fresh reconciler and re-renders it; exits 1 when the replayed
verdicts differ from the recorded ones or the recording has no footer to compare with.
Options: --speed X (default 1; 'max' for no waiting) --view --export --reconciler --color
--palette --json.
"""

EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a process killed by it


def _error(message: str) -> int:
    print(f"parallelhue: error: {one_line(message, 400)}", file=sys.stderr)
    return 2


def _console_for(view: str, no_color: bool, stderr: bool) -> Console:
    return make_console(no_color, plain=(view == "plain"), stderr=stderr)


class _ViewHolder:
    """Builds the session's view and remembers it and the run model (for --export,
    --json and the partial summary after Ctrl-C)."""

    def __init__(self, console: Console, config: RunConfig) -> None:
        self.console = console
        self.config = config
        self.session: Session | None = None
        self.view: Any = None
        self.model: RunModel | None = None

    def attach(self, session: Session, config: RunConfig) -> None:
        self.session = session
        self.config = config

    def __call__(self, model: RunModel) -> View:
        config = self.config
        model.model_name = self.session.model_name if self.session is not None else None
        model.server = display_server(config.endpoint)
        model.color_by = config.color_by
        model.palette = config.palette
        view: View
        if config.tmux:
            from ..screen.tmux import TmuxView

            view = TmuxView(model, self.console, attach=not config.no_attach)
        else:
            view = make_view(config.view, model, self.console)
        self.view = view
        self.model = model
        return view

    def interrupted(self) -> None:
        """Ctrl-C or q: the partial summary (and JSON) of what was seen so far."""
        model = self.model
        if model is None:
            return
        model.interrupted = True
        print_summary(self.console, model)
        if self.config.json_output:
            _print_json(model, self.config.endpoint, EXIT_INTERRUPTED, "interrupted")


def _print_json(model: RunModel, endpoint: str | None, code: int, message: str | None) -> None:
    document = json_document(model, endpoint=endpoint, exit_code=code, message=message)
    sys.stdout.write(json.dumps(document, ensure_ascii=False, indent=2) + "\n")
    sys.stdout.flush()


def _files_there(*paths: str | None) -> set[str]:
    """Which output files exist before the run (their confirmation says they were replaced)."""
    return {p for p in paths if p is not None and p != STDOUT and os.path.exists(p)}


def _wrote(what: str, path: str | None, there: set[str]) -> None:
    """One line per output file: where it went, and whether a file was replaced."""
    if path is None or path == STDOUT:
        return
    replaced = " (replaced the file that was there)" if path in there else ""
    print(f"parallelhue: {what} written to {path}{replaced}", file=sys.stderr)


def _finish(result: SessionResult, config: RunConfig, holder: _ViewHolder, there: set[str]) -> int:
    model = result.model
    if config.export is not None:
        export_picture(config.export, model, holder.view)
    if config.measurement is not None:
        model_name = holder.session.model_name if holder.session is not None else None
        write_measurement(config.measurement, model, config, model_name)
    _wrote("recording", config.record, there)
    _wrote("picture", config.export, there)
    _wrote("measurement", config.measurement, there)
    if config.json_output:
        _print_json(model, config.endpoint, result.exit_code, result.message)
    if result.message:
        print(f"parallelhue: {result.message}", file=sys.stderr)
    return result.exit_code


def _warn(config: RunConfig) -> None:
    for warning in config.warnings:
        print(f"parallelhue: warning: {warning}", file=sys.stderr)
    if config.start_delay > 0:
        print(
            f"parallelhue: the first request starts {config.start_delay:g} s after the screen "
            "(--start-delay)",
            file=sys.stderr,
        )


def _run(config: RunConfig) -> int:
    _warn(config)
    console = _console_for(config.view, config.no_color, config.stdout_reserved)
    holder = _ViewHolder(console, config)
    session = Session(config, holder)
    holder.attach(session, config)
    there = _files_there(config.record, config.export, config.measurement)
    try:
        result = asyncio.run(session.run())
    except KeyboardInterrupt:
        holder.interrupted()
        raise
    return _finish(result, config, holder, there)


def _demo(args: list[str]) -> int:
    from .demo import parse_demo, run_demo

    demo = parse_demo(args)
    run = demo.run
    _warn(run)
    console = _console_for(run.view, run.no_color, run.stdout_reserved)
    holder = _ViewHolder(console, run)
    there = _files_there(run.record, run.export, run.measurement)
    try:
        result, _session = asyncio.run(run_demo(demo, holder, holder.attach))
    except KeyboardInterrupt:
        holder.interrupted()
        raise
    return _finish(result, holder.config, holder, there)


def _replay(args: list[str]) -> int:
    from .replay import replay

    config = parse_replay(args)
    console = _console_for(config.view, config.no_color, config.stdout_reserved)
    there = _files_there(config.export)
    code, message, model, view = asyncio.run(replay(config, console))
    if config.export is not None:
        export_picture(config.export, model, view)
        _wrote("picture", config.export, there)
    if config.json_output:
        _print_json(model, None, code, message)
    if message:
        print(f"parallelhue: {message}", file=sys.stderr)
    return code


def _wants_help(args: Sequence[str]) -> bool:
    return any(a in ("-h", "--help") for a in args)


def _dispatch(args: list[str]) -> int:
    if args and args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0
    if args and args[0] == "--version":
        from parallelhue import __version__

        print(f"parallelhue {__version__}")
        return 0
    if args and args[0] == "_tmux-pane":
        from ..screen.tmux import pane_main

        return int(pane_main(args[1:]))
    if args and args[0] == "demo":
        if _wants_help(args[1:]):
            print(demo_usage(), end="")
            return 0
        return _demo(args[1:])
    if args and args[0] == "replay":
        if _wants_help(args[1:]):
            print(REPLAY_USAGE, end="")
            return 0
        return _replay(args[1:])
    if _wants_help(args):
        print(USAGE, end="")
        return 0
    return _run(parse_run(args))


def _stdout_closed() -> int:
    """stdout's reader went away (`| head`): stop quietly, no second error at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    print("parallelhue: stdout was closed (broken pipe): output stopped", file=sys.stderr)
    return EXIT_BROKEN_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return _dispatch(args)
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
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _stdout_closed()
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
