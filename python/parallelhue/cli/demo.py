"""`parallelhue demo`: a normal session against the embedded SIMULATED engine.

The demo's own flags (the simulated engine's knobs: acceptance, draft length,
step time, fault injection) are parsed and checked here, next to the engine
they configure; everything else is the run's (config.py). Everything the demo
shows is labelled SIMULATED ENGINE.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..model.sanitize import one_line
from .config import (
    ConfigError,
    Parser,
    Sources,
    check_float,
    check_int,
    common_flags,
    resolve_common,
    run_config,
)
from .settings import DEFAULT_ENDPOINT, DEFAULT_TIMEOUT, RunConfig

if TYPE_CHECKING:
    from ..session import Session, SessionResult, ViewFactory

__all__ = ["DEMO_MAX_CONCURRENCY", "DEMO_PROMPT", "DemoConfig", "parse_demo", "run_demo"]

DEMO_MAX_CONCURRENCY = 64
# Slow enough to watch: 256 tokens at a step every 80 ms take about 15 s.
DEMO_STEP_MS = 80.0
DEMO_MAX_TOKENS = 256
DEMO_PROMPT = "Explain speculative decoding to a curious engineer, with a short example."


@dataclass(frozen=True)
class DemoConfig:
    run: RunConfig
    acceptance: float | None
    draft_len: int
    step_ms: float
    faults: str | None = None  # the simulator's fault spec (docs/SIMULATOR.md), validated


def parse_demo(
    argv: Sequence[str], env: Mapping[str, str] | None = None, stdout_tty: bool | None = None
) -> DemoConfig:
    """Validate `parallelhue demo` flags (the simulated engine's knobs included)."""
    env = os.environ if env is None else env
    stdout_tty = sys.stdout.isatty() if stdout_tty is None else stdout_tty
    parser = Parser(prog="parallelhue demo", add_help=False)
    common_flags(parser)
    for flag in ("--acceptance", "--draft-len", "--step-ms", "--fault"):
        parser.add_argument(flag)
    args = parser.parse_args(list(argv))
    # The demo talks to its own engine: the endpoint, model and key variables do
    # not apply, but the display and request-shape ones do.
    src = Sources(args, env)
    common = resolve_common(
        src,
        default_concurrency=16,
        concurrency_limit=DEMO_MAX_CONCURRENCY,
        warn_above=None,
        stdout_tty=stdout_tty,
    )
    if src.get("--telemetry", "PARALLELHUE_TELEMETRY") is None:
        common["telemetry"] = "socket"  # the demo's engine shares this host
    if src.get("--max-tokens", "PARALLELHUE_MAX_TOKENS") is None:
        common["max_tokens"] = DEMO_MAX_TOKENS
    prompt = args.prompt if args.prompt is not None else DEMO_PROMPT
    if not prompt.strip():
        raise ConfigError("the prompt is empty: give some text")
    acceptance = (
        check_float("--acceptance", args.acceptance, 0.0, 1.0)
        if args.acceptance is not None
        else None
    )
    draft_len = check_int("--draft-len", args.draft_len, 1, 16) if args.draft_len is not None else 4
    step_ms = (
        check_float("--step-ms", args.step_ms, 0.0, 10_000.0)
        if args.step_ms is not None
        else DEMO_STEP_MS
    )
    run = run_config(
        common,
        env,
        endpoint=DEFAULT_ENDPOINT,  # replaced by the simulated engine's URL
        model=None,
        prompts=[prompt] * int(common["requests"]),
        api_key=None,
        timeout=DEFAULT_TIMEOUT,
        backend="auto",
    )
    faults = None
    if args.fault is not None:
        from ..sim import FaultConfig

        try:
            FaultConfig.parse(args.fault)
        except ValueError as error:
            raise ConfigError(f"--fault: {one_line(str(error), 400)}") from None
        faults = args.fault
    return DemoConfig(
        run=run, acceptance=acceptance, draft_len=draft_len, step_ms=step_ms, faults=faults
    )


async def run_demo(
    demo: DemoConfig,
    view_factory: ViewFactory,
    on_session: Callable[[Session, RunConfig], None] | None = None,
) -> tuple[SessionResult, Session]:
    """Start the simulated engine in this process, run a session against it, stop it."""
    from ..session import Session, new_run_id, resolve_socket
    from ..sim import FaultConfig, SimConfig, SimServer

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
        session = Session(config, view_factory, simulated=True, title="ParallelHue demo")
        if on_session is not None:
            on_session(session, config)  # the CLI's view holder needs both
        return await session.run(), session
    finally:
        await server.stop()
