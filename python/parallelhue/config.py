"""Command-line flags and environment variables, validated into plain settings.

Every value, from a flag or from the environment, is checked here before any
network or terminal work starts. A bad value raises `ConfigError` with one
line that names the flag or variable, the accepted range and the value given;
the CLI prints it and exits 2. Flags win over environment variables, which
win over defaults. argparse only splits the command line: all checking is
ours, so the messages are exact and never a usage dump.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NoReturn
from urllib.parse import urlsplit, urlunsplit

from .sanitize import one_line

__all__ = [
    "BACKEND_METHODS",
    "DEFAULT_ENDPOINT",
    "MAX_CONCURRENCY",
    "ConfigError",
    "DemoConfig",
    "ReplayConfig",
    "RunConfig",
    "parse_demo",
    "parse_replay",
    "parse_run",
]

DEFAULT_ENDPOINT = "http://127.0.0.1:8000/v1/chat/completions"
DEFAULT_MAX_TOKENS = 128
DEFAULT_TIMEOUT = 60.0
# The grid shows up to this many panes; more streams run but get a warning.
MAX_CONCURRENCY = 64
# Beyond this a run is almost certainly a typo; the wire format allows 65535.
HARD_CONCURRENCY_LIMIT = 1024
MAX_SEED = 2**32 - 1
MODES = ("exact", "auto", "chunk")
VIEWS = ("stream", "grid", "plain")
RECONCILERS = ("rust", "python")
TELEMETRY = ("auto", "socket", "http")  # telemetry.TELEMETRY_CHOICES
MAX_UID = 2**32 - 2  # (uid_t)-1 means "no uid"
# Speculative methods vLLM knows (vllm/config/speculative.py) plus the names the
# predecessor accepted; `--backend` is a declaration, so only spelling is checked.
BACKEND_METHODS = (
    "ngram",
    "ngram_gpu",
    "suffix",
    "draft_model",
    "eagle",
    "eagle3",
    "mtp",
    "medusa",
    "mlp_speculator",
    "dflash",
    "dspark",
)
DEMO_MAX_CONCURRENCY = 64


class ConfigError(Exception):
    """A bad flag or environment value; the message is one line naming the fix."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports mistakes as one ConfigError line instead of usage + exit."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see parallelhue --help)")


@dataclass(frozen=True)
class RunConfig:
    endpoint: str
    model: str | None
    prompts: list[str]  # one per stream, already fanned out
    max_tokens: int
    concurrency: int
    api_key: str | None
    mode: str
    socket_dir: str | None
    timeout: float
    backend: str
    temperature: float | None
    seed: int
    view: str
    tmux: bool
    no_attach: bool
    record: str | None
    export: str | None
    measurement: str | None
    reconciler: str
    no_color: bool
    warnings: list[str] = field(default_factory=list)
    telemetry: str = "auto"  # telemetry.TELEMETRY_CHOICES
    accept_uids: tuple[int, ...] = ()  # --accept-uid: socket senders besides our own uid


@dataclass(frozen=True)
class DemoConfig:
    run: RunConfig
    acceptance: float | None
    draft_len: int
    step_ms: float
    faults: str | None = None  # the simulator's fault spec (docs/SIMULATOR.md), validated


@dataclass(frozen=True)
class ReplayConfig:
    path: str
    speed: float  # math.inf: no waiting
    view: str
    export: str | None
    reconciler: str
    no_color: bool


# --- value checkers -------------------------------------------------------------


def _int(name: str, raw: str, low: int, high: int) -> int:
    try:
        value = int(raw.strip(), 10)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise ConfigError(f"{name} must be an integer from {low} to {high}, got '{one_line(raw)}'")
    return value


def _float(name: str, raw: str, low: float, high: float, *, low_open: bool = False) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    too_low = value <= low if low_open else value < low
    if not math.isfinite(value) or too_low or value > high:
        bound = f"greater than {low:g}" if low_open else f"from {low:g}"
        raise ConfigError(f"{name} must be a number {bound} to {high:g}, got '{one_line(raw)}'")
    return value


def _choice(name: str, raw: str, choices: Sequence[str]) -> str:
    value = raw.strip()
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, got '{one_line(raw)}'")
    return value


def _endpoint(name: str, raw: str) -> str:
    value = raw.strip()
    try:
        parts = urlsplit(value)
        port = parts.port  # raises ValueError on a bad port
    except ValueError:
        parts, port = None, None
    ok = (
        parts is not None
        and parts.scheme in ("http", "https")
        and bool(parts.hostname)
        and parts.path.rstrip("/").endswith(("/chat/completions", "/completions"))
        and not parts.query
        and not parts.fragment
    )
    if not ok or parts is None:
        shown = value
        if parts is not None and (parts.username or parts.password):
            # Never echo credentials embedded in a URL.
            host = parts.hostname or ""
            netloc = f"***@{host}" + (f":{port}" if port else "")
            shown = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
        raise ConfigError(
            f"{name} must be an http(s) URL ending in /v1/chat/completions or "
            f"/v1/completions, got '{one_line(shown)}'"
        )
    return value.rstrip("/")


def _api_key(name: str, raw: str) -> str:
    if any(ch.isspace() or not ch.isprintable() for ch in raw):
        # The key goes into an HTTP header; never echo it.
        raise ConfigError(f"{name} contains whitespace or control characters: check the key")
    return raw


def _backend(name: str, raw: str) -> str:
    value = raw.strip()
    if value in ("auto", "generic", *BACKEND_METHODS):
        return value
    raise ConfigError(
        f"{name} must be auto, generic or a speculative method "
        f"({', '.join(BACKEND_METHODS)}), got '{one_line(raw)}'"
    )


def _output_file(name: str, raw: str, suffixes: Sequence[str] | None = None) -> str:
    path = raw.strip()
    if not path:
        raise ConfigError(f"{name} needs a file name")
    if suffixes is not None and not path.lower().endswith(tuple(suffixes)):
        raise ConfigError(f"{name} must end in {' or '.join(suffixes)}, got '{one_line(raw)}'")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ConfigError(f"{name}: directory {one_line(parent)} does not exist")
    if os.path.isdir(path):
        raise ConfigError(f"{name}: {one_line(path)} is a directory, give a file name")
    return path


def _read_prompt_file(name: str, raw: str) -> list[str]:
    path = raw.strip()
    try:
        with open(path, encoding="utf-8") as handle:
            content = handle.read()
    except FileNotFoundError:
        raise ConfigError(f"{name}: no such file {one_line(path)}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{name}: {one_line(path)} is not UTF-8 text") from None
    except OSError as error:
        raise ConfigError(f"{name}: cannot read {one_line(path)}: {error.strerror}") from None
    if path.lower().endswith(".json"):
        try:
            data = json.loads(content)
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"{name}: {one_line(path)} is not valid JSON (line {error.lineno}): "
                "give a JSON list of strings"
            ) from None
        if not isinstance(data, list) or not all(isinstance(item, str) for item in data):
            raise ConfigError(f"{name}: {one_line(path)} must hold a JSON list of strings")
        prompts = [item for item in data if item.strip()]
    else:
        prompts = [line for line in content.splitlines() if line.strip()]
    if not prompts:
        raise ConfigError(f"{name}: {one_line(path)} holds no prompts (one per line)")
    return prompts


# --- parsing --------------------------------------------------------------------


class _Sources:
    """Look a setting up as a flag first, then as an environment variable."""

    def __init__(self, args: argparse.Namespace, env: Mapping[str, str]) -> None:
        self.args = args
        self.env = env

    def get(self, flag: str, var: str | None) -> tuple[str, str] | None:
        value = getattr(self.args, flag.lstrip("-").replace("-", "_"), None)
        if value is not None:
            return flag, value
        if var is not None:
            env_value = self.env.get(var)
            if env_value:  # an empty variable counts as unset
                return var, env_value
        return None


def _common_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--view")
    parser.add_argument("--mode")
    parser.add_argument("--max-tokens")
    parser.add_argument("--concurrency")
    parser.add_argument("--socket-dir")
    parser.add_argument("--seed")
    parser.add_argument("--temperature")
    parser.add_argument("--record")
    parser.add_argument("--export")
    parser.add_argument("--measurement")
    parser.add_argument("--reconciler")
    parser.add_argument("--telemetry")
    parser.add_argument("--prompt")
    parser.add_argument("--tmux", action="store_true", default=None)
    parser.add_argument("--no-attach", action="store_true", default=None)


def _run_parser() -> _Parser:
    parser = _Parser(prog="parallelhue", add_help=False)
    parser.add_argument("prompt_arg", nargs="?")
    parser.add_argument("--endpoint")
    parser.add_argument("--model")
    parser.add_argument("--prompt-file")
    parser.add_argument("--api-key")
    parser.add_argument("--timeout")
    parser.add_argument("--backend")
    parser.add_argument("--accept-uid", action="append")
    _common_flags(parser)
    return parser


def _default_view(concurrency: int, stdout_tty: bool) -> str:
    if not stdout_tty:
        return "plain"
    return "stream" if concurrency == 1 else "grid"


def _resolve_common(
    src: _Sources,
    *,
    default_concurrency: int,
    concurrency_limit: int,
    warn_above: int | None,
    stdout_tty: bool,
) -> dict[str, object]:
    """Settings shared by a normal run and the demo."""
    warnings: list[str] = []
    got = src.get("--max-tokens", "PARALLELHUE_MAX_TOKENS")
    max_tokens = _int(got[0], got[1], 1, 1_000_000) if got else DEFAULT_MAX_TOKENS
    got = src.get("--concurrency", "PARALLELHUE_CONCURRENCY")
    concurrency = _int(got[0], got[1], 1, concurrency_limit) if got else default_concurrency
    if got and warn_above is not None and concurrency > warn_above:
        warnings.append(
            f"{got[0]} {concurrency} is above {warn_above}: every stream runs, "
            f"but the grid shows only the first {warn_above}"
        )
    got = src.get("--mode", "PARALLELHUE_MODE")
    mode = _choice(got[0], got[1], MODES) if got else "auto"
    got = src.get("--view", "PARALLELHUE_VIEW")
    view = _choice(got[0], got[1], VIEWS) if got else _default_view(concurrency, stdout_tty)
    got = src.get("--reconciler", "PARALLELHUE_RECONCILER")
    reconciler = _choice(got[0], got[1], RECONCILERS) if got else "rust"
    got = src.get("--telemetry", "PARALLELHUE_TELEMETRY")
    telemetry = _choice(got[0], got[1], TELEMETRY) if got else "auto"
    got = src.get("--seed", "PARALLELHUE_SEED")
    seed = _int(got[0], got[1], 0, MAX_SEED) if got else 0
    got = src.get("--temperature", "PARALLELHUE_TEMPERATURE")
    temperature = _float(got[0], got[1], 0.0, 100.0) if got else None
    socket_dir: str | None = None
    got = src.get("--socket-dir", None)
    if got is not None:
        if not got[1].strip():
            raise ConfigError("--socket-dir needs a directory path")
        socket_dir = got[1]
    record = src.get("--record", None)
    export = src.get("--export", None)
    measurement = src.get("--measurement", None)
    tmux = bool(src.args.tmux)
    no_attach = bool(src.args.no_attach)
    if no_attach and not tmux:
        raise ConfigError("--no-attach only applies with --tmux")
    if view == "stream" and concurrency > 1:
        raise ConfigError(
            f"--view stream shows one stream, but {concurrency} streams were asked for: "
            "use --view grid or --concurrency 1"
        )
    return {
        "max_tokens": max_tokens,
        "concurrency": concurrency,
        "mode": mode,
        "view": view,
        "reconciler": reconciler,
        "telemetry": telemetry,
        "seed": seed,
        "temperature": temperature,
        "socket_dir": socket_dir,
        "record": _output_file(*record) if record else None,
        "export": _output_file(*export, (".svg", ".html", ".htm")) if export else None,
        "measurement": _output_file(*measurement) if measurement else None,
        "tmux": tmux,
        "no_attach": no_attach,
        "warnings": warnings,
    }


def _accept_uids(src: _Sources, telemetry: str) -> tuple[int, ...]:
    """--accept-uid UID (repeatable) or PARALLELHUE_ACCEPT_UIDS=UID[,UID...]."""
    flags: list[str] | None = src.args.accept_uid
    if flags:
        given = [("--accept-uid", raw) for raw in flags]
    else:
        raw_env = src.env.get("PARALLELHUE_ACCEPT_UIDS", "")
        given = [("PARALLELHUE_ACCEPT_UIDS", part) for part in raw_env.split(",") if part.strip()]
    uids: list[int] = []
    for name, raw in given:
        uid = _int(name, raw, 0, MAX_UID)
        if uid == os.geteuid():
            raise ConfigError(f"{name} {uid} is this client's own uid: it is always accepted")
        if uid not in uids:
            uids.append(uid)
    if uids and telemetry == "http":
        raise ConfigError(
            f"{given[0][0]} applies to the telemetry socket: not with --telemetry http"
        )
    return tuple(uids)


def _no_color(env: Mapping[str, str]) -> bool:
    # https://no-color.org: present and not empty disables color.
    return bool(env.get("NO_COLOR"))


def _fan_out(prompts: list[str], concurrency: int, source: str) -> list[str]:
    """One prompt per stream: a single prompt is repeated, a list is cycled."""
    if len(prompts) > concurrency:
        raise ConfigError(
            f"{source} holds {len(prompts)} prompts but --concurrency is {concurrency}: "
            f"raise --concurrency to {len(prompts)} or leave it out"
        )
    return [prompts[i % len(prompts)] for i in range(concurrency)]


def parse_run(
    argv: Sequence[str], env: Mapping[str, str] | None = None, stdout_tty: bool | None = None
) -> RunConfig:
    """Validate a normal run's flags and environment."""
    env = os.environ if env is None else env
    stdout_tty = sys.stdout.isatty() if stdout_tty is None else stdout_tty
    args = _run_parser().parse_args(list(argv))
    src = _Sources(args, env)

    prompt_file = src.get("--prompt-file", "PARALLELHUE_PROMPT_FILE")
    prompt_given = args.prompt_arg is not None or args.prompt is not None
    if args.prompt_arg is not None and args.prompt is not None:
        raise ConfigError("give the prompt either as an argument or with --prompt, not both")
    if prompt_file is not None and prompt_given:
        if prompt_file[0] != "--prompt-file":
            prompt_file = None  # a prompt on the command line wins over the environment
        else:
            raise ConfigError("give either a prompt or --prompt-file, not both")
    file_prompts = _read_prompt_file(*prompt_file) if prompt_file else None
    single = args.prompt_arg if args.prompt_arg is not None else args.prompt
    if single is None and file_prompts is None:
        single = env.get("PARALLELHUE_PROMPT") or None
    if single is not None and not single.strip():
        raise ConfigError("the prompt is empty: give some text")

    default_concurrency = 1
    if file_prompts is not None:
        default_concurrency = min(len(file_prompts), HARD_CONCURRENCY_LIMIT)
    common = _resolve_common(
        src,
        default_concurrency=default_concurrency,
        concurrency_limit=HARD_CONCURRENCY_LIMIT,
        warn_above=MAX_CONCURRENCY,
        stdout_tty=stdout_tty,
    )
    concurrency = int(str(common["concurrency"]))
    if file_prompts is not None:
        assert prompt_file is not None
        prompts = _fan_out(file_prompts, concurrency, prompt_file[0])
    elif single is not None:
        prompts = [single] * concurrency
    else:
        raise ConfigError(
            "no prompt: give it as an argument, with --prompt, --prompt-file or PARALLELHUE_PROMPT"
        )

    got = src.get("--endpoint", "PARALLELHUE_ENDPOINT")
    endpoint = _endpoint(got[0], got[1]) if got else DEFAULT_ENDPOINT
    got = src.get("--model", "PARALLELHUE_MODEL")
    model = got[1].strip() if got else None
    if got and not model:
        raise ConfigError(f"{got[0]} is empty: give a model name or leave it out")
    got = src.get("--api-key", "PARALLELHUE_API_KEY") or src.get("--api-key", "OPENAI_API_KEY")
    api_key = _api_key(got[0], got[1]) if got else None
    got = src.get("--timeout", "PARALLELHUE_TIMEOUT")
    timeout = _float(got[0], got[1], 0.0, 86400.0, low_open=True) if got else DEFAULT_TIMEOUT
    got = src.get("--backend", "PARALLELHUE_BACKEND")
    backend = _backend(got[0], got[1]) if got else "auto"
    accept_uids = _accept_uids(src, str(common["telemetry"]))

    return _run_config(
        common,
        env,
        endpoint=endpoint,
        model=model,
        prompts=prompts,
        api_key=api_key,
        timeout=timeout,
        backend=backend,
        accept_uids=accept_uids,
    )


def _run_config(
    common: Mapping[str, object],
    env: Mapping[str, str],
    *,
    endpoint: str,
    model: str | None,
    prompts: list[str],
    api_key: str | None,
    timeout: float,
    backend: str,
    accept_uids: tuple[int, ...] = (),
) -> RunConfig:
    """A RunConfig from the resolved common flags plus what differs between run and demo."""
    return RunConfig(
        endpoint=endpoint,
        model=model,
        prompts=prompts,
        max_tokens=int(str(common["max_tokens"])),
        concurrency=int(str(common["concurrency"])),
        api_key=api_key,
        mode=str(common["mode"]),
        socket_dir=_optional_str(common["socket_dir"]),
        timeout=timeout,
        backend=backend,
        temperature=_optional_float(common["temperature"]),
        seed=int(str(common["seed"])),
        view=str(common["view"]),
        tmux=bool(common["tmux"]),
        no_attach=bool(common["no_attach"]),
        record=_optional_str(common["record"]),
        export=_optional_str(common["export"]),
        measurement=_optional_str(common["measurement"]),
        reconciler=str(common["reconciler"]),
        no_color=_no_color(env),
        warnings=list(_str_list(common["warnings"])),
        telemetry=str(common["telemetry"]),
        accept_uids=accept_uids,
    )


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)


def _optional_float(value: object) -> float | None:
    return None if value is None else float(str(value))


def _str_list(value: object) -> list[str]:
    return [str(item) for item in value] if isinstance(value, list) else []


DEMO_PROMPT = "Explain speculative decoding to a curious engineer, with a short example."


def parse_demo(
    argv: Sequence[str], env: Mapping[str, str] | None = None, stdout_tty: bool | None = None
) -> DemoConfig:
    """Validate `parallelhue demo` flags (the simulated engine's knobs included)."""
    env = os.environ if env is None else env
    stdout_tty = sys.stdout.isatty() if stdout_tty is None else stdout_tty
    parser = _Parser(prog="parallelhue demo", add_help=False)
    _common_flags(parser)
    parser.add_argument("--acceptance")
    parser.add_argument("--draft-len")
    parser.add_argument("--step-ms")
    parser.add_argument("--fault")
    args = parser.parse_args(list(argv))
    # The demo talks to its own engine: the endpoint, model and key variables do
    # not apply, but the display and request-shape ones do.
    src = _Sources(args, env)
    common = _resolve_common(
        src,
        default_concurrency=16,
        concurrency_limit=DEMO_MAX_CONCURRENCY,
        warn_above=None,
        stdout_tty=stdout_tty,
    )
    if src.get("--telemetry", "PARALLELHUE_TELEMETRY") is None:
        common["telemetry"] = "socket"  # the demo's engine shares this host
    concurrency = int(str(common["concurrency"]))
    prompt = args.prompt if args.prompt is not None else DEMO_PROMPT
    if not prompt.strip():
        raise ConfigError("the prompt is empty: give some text")
    acceptance = (
        _float("--acceptance", args.acceptance, 0.0, 1.0) if args.acceptance is not None else None
    )
    draft_len = _int("--draft-len", args.draft_len, 1, 16) if args.draft_len is not None else 4
    step_ms = _float("--step-ms", args.step_ms, 0.0, 10_000.0) if args.step_ms is not None else 20.0
    run = _run_config(
        common,
        env,
        endpoint=DEFAULT_ENDPOINT,  # replaced by the simulated engine's URL
        model=None,
        prompts=[prompt] * concurrency,
        api_key=None,
        timeout=DEFAULT_TIMEOUT,
        backend="auto",
    )
    faults = None
    if args.fault is not None:
        from .sim import FaultConfig

        try:
            FaultConfig.parse(args.fault)
        except ValueError as error:
            raise ConfigError(f"--fault: {one_line(str(error), 400)}") from None
        faults = args.fault
    return DemoConfig(
        run=run, acceptance=acceptance, draft_len=draft_len, step_ms=step_ms, faults=faults
    )


def parse_replay(
    argv: Sequence[str], env: Mapping[str, str] | None = None, stdout_tty: bool | None = None
) -> ReplayConfig:
    """Validate `parallelhue replay FILE` flags."""
    env = os.environ if env is None else env
    stdout_tty = sys.stdout.isatty() if stdout_tty is None else stdout_tty
    parser = _Parser(prog="parallelhue replay", add_help=False)
    parser.add_argument("file", nargs="?")
    parser.add_argument("--speed")
    parser.add_argument("--view")
    parser.add_argument("--export")
    parser.add_argument("--reconciler")
    args = parser.parse_args(list(argv))
    if args.file is None:
        raise ConfigError("replay needs a recording: parallelhue replay FILE")
    if not os.path.isfile(args.file):
        raise ConfigError(f"replay: no such file {one_line(args.file)}")
    speed = math.inf
    if args.speed is None:
        speed = 1.0
    elif args.speed.strip() != "max":
        speed = _float("--speed", args.speed, 0.0, 1000.0, low_open=True)
    src = _Sources(args, env)
    got = src.get("--view", "PARALLELHUE_VIEW")
    view = _choice(got[0], got[1], VIEWS) if got else ("grid" if stdout_tty else "plain")
    got = src.get("--reconciler", "PARALLELHUE_RECONCILER")
    reconciler = _choice(got[0], got[1], RECONCILERS) if got else "rust"
    export = (
        _output_file("--export", args.export, (".svg", ".html", ".htm"))
        if args.export is not None
        else None
    )
    return ReplayConfig(
        path=args.file,
        speed=speed,
        view=view,
        export=export,
        reconciler=reconciler,
        no_color=_no_color(env),
    )
