"""`python -m parallelhue.sim`: run the SIMULATED engine as a standalone server."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import NoReturn

from parallelhue_vllm import paths
from parallelhue_vllm.hub import HubLimits

from .config import STOCK_SERVERS, TELEMETRY_MODES, FaultConfig, SimConfig
from .server import SimServer

PROG = "python -m parallelhue.sim"
SWITCH_INTERVAL = 0.0005


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, no usage dump: the message names the flag to fix.
        sys.stderr.write(f"{PROG}: error: {message} (see --help)\n")
        sys.exit(2)


def _acceptance(text: str) -> float | list[float]:
    try:
        values = [float(item) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a rate or a comma-separated list of rates in 0..1"
        ) from None
    for value in values:
        if not 0.0 <= value <= 1.0:
            raise argparse.ArgumentTypeError(f"acceptance {value} is outside 0..1")
    return values[0] if len(values) == 1 else values


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description=(
            "SIMULATED speculative-decoding engine with an OpenAI-compatible API and "
            "ParallelHue telemetry. Every number it produces is simulated."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="listen port (default 8000)")
    parser.add_argument(
        "--socket-dir",
        default=None,
        help="telemetry socket directory of the client (default: the client's default)",
    )
    parser.add_argument("--draft-len", type=int, default=4, help="drafts per step K (default 4)")
    parser.add_argument(
        "--acceptance",
        type=_acceptance,
        default=None,
        help="draft acceptance rate, or a comma list cycled over streams (default: a spread)",
    )
    parser.add_argument(
        "--step-ms", type=float, default=20.0, help="engine step time in ms, 0 = as fast as it goes"
    )
    parser.add_argument("--seed", type=int, default=0, help="default seed for the text")
    parser.add_argument(
        "--no-draft-rate",
        type=float,
        default=0.08,
        help="probability of a step without drafts (default 0.08)",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=256, help="max_tokens when a request omits it"
    )
    parser.add_argument(
        "--max-model-len", type=int, default=8192, help="model length limit (default 8192)"
    )
    parser.add_argument(
        "--sse-interval-ms",
        type=float,
        default=0.0,
        help="at most one SSE chunk per stream per this many ms; steps between merge (default 0)",
    )
    parser.add_argument(
        "--min-batch",
        type=int,
        default=1,
        help="benchmarks: wait (up to 10 s) for this many requests before the first step",
    )
    telemetry = parser.add_mutually_exclusive_group()
    telemetry.add_argument(
        "--telemetry",
        choices=TELEMETRY_MODES,
        default="socket",
        help="where telemetry goes: the client's socket, in-band in each request's "
        "own response (http), or both (default socket)",
    )
    telemetry.add_argument("--no-telemetry", action="store_true", help="send no telemetry frames")
    telemetry.add_argument(
        "--stock",
        choices=STOCK_SERVERS,
        default=None,
        help="play a stock server without the plugin (no frames): vllm (per-step lists in the "
        "final usage chunk) or llamacpp (a chunk per token with cumulative timings)",
    )
    parser.add_argument(
        "--api-key",
        action="append",
        default=None,
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on every /v1 route, as vLLM's --api-key "
        "(repeatable)",
    )
    parser.add_argument(
        "--fault", default=None, help="inject faults, e.g. drop:0.01,sse-byte (docs/SIMULATOR.md)"
    )
    parser.add_argument("--log-requests", action="store_true", help="log every request")
    return parser


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """Build and validate the config; ValueError carries the one-line reason."""
    faults = FaultConfig.parse(args.fault) if args.fault else None
    if args.socket_dir is not None:
        # Refuse a directory whose socket paths could never fit sun_path.
        paths.socket_path(args.socket_dir, "0" * 32)
    config = SimConfig(
        draft_len=args.draft_len,
        acceptance=args.acceptance,
        step_ms=args.step_ms,
        seed=args.seed,
        socket_dir=args.socket_dir,
        telemetry=not args.no_telemetry and args.stock is None,
        stock=args.stock,
        telemetry_mode=args.telemetry,
        api_keys=tuple(args.api_key or ()),
        hub_limits=HubLimits.from_env(),
        faults=faults,
        host=args.host,
        port=args.port,
        no_draft_rate=args.no_draft_rate,
        default_max_tokens=args.max_tokens,
        max_model_len=args.max_model_len,
        min_batch=args.min_batch,
        sse_interval_ms=args.sse_interval_ms,
        log_requests=args.log_requests,
    )
    config.validate()
    return config


async def _serve(config: SimConfig) -> None:
    server = SimServer(config)
    url = await server.start()
    print(f"SIMULATED engine (parallelhue.sim) serving {url}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except (ValueError, paths.SocketPathError) as error:
        parser.error(str(error))
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    # The emitters' sender threads block in send() and must win the GIL back
    # quickly from the busy event loop; the default 5 ms switch interval would
    # cap each of them near 200 frames/s.
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        asyncio.run(_serve(config))
    except OSError as error:
        sys.stderr.write(f"{PROG}: error: {error}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
