"""Command-line flags and environment variables, validated into settings (settings.py).

Every value, from a flag or from the environment, is checked here before any
network or terminal work starts. A bad value raises `ConfigError` with one
line that names the flag or variable, the accepted range and the value given;
the CLI prints it and exits 2. Flags win over environment variables, which
win over defaults. argparse only splits the command line: all checking is
ours, so the messages are exact and never a usage dump. The demo's own flags
are parsed by `demo.py` with the helpers here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from ..ingest.request import RESERVED_BODY_KEYS
from ..model.endpoint import EndpointError, api_kind, completions_url
from ..model.sanitize import one_line
from .settings import (
    COLOR_MODES,
    DEFAULT_BASE_URL,
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TIMEOUT,
    HARD_CONCURRENCY_LIMIT,
    MAX_CONCURRENCY,
    MAX_REQUEST_RATE,
    MAX_REQUESTS,
    MAX_SEED,
    MAX_START_DELAY,
    MAX_UID,
    MODES,
    PALETTE_NAMES,
    RECONCILERS,
    STDOUT,
    TELEMETRY,
    VIEWS,
    ReplayConfig,
    RunConfig,
    dumb_terminal,
)

__all__ = [
    "BACKEND_METHODS",
    "ConfigError",
    "Parser",
    "Sources",
    "common_flags",
    "dumb_terminal",
    "parse_replay",
    "parse_run",
    "resolve_common",
    "run_config",
]

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
APIS = ("chat", "completions")
# Headers parallelhue sets itself on every request (or the HTTP layer does).
_RESERVED_HEADERS = (
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "x-request-id",
    "accept-encoding",
)
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class ConfigError(Exception):
    """A bad flag or environment value; the message is one line naming the fix."""


# The predecessor's internal flags of its tmux panes (its cli.py): parallelhue runs
# its panes itself (--tmux), so these name what replaced them.
REMOVED_FLAGS = (
    "--worker-index",
    "--summary-follow",
    "--session",
    "--summary-start-epoch",
    "--summary-timeout",
)


class Parser(argparse.ArgumentParser):
    """argparse that reports mistakes as one ConfigError line instead of usage + exit."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see {self.prog} --help)")

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: None = None
    ) -> argparse.Namespace:
        """Unknown options are named alone, never with the words after them."""
        known, extra = self.parse_known_args(args, namespace)
        for token in extra:
            flag = token.split("=", 1)[0]
            if flag in REMOVED_FLAGS:
                raise ConfigError(
                    f"{flag} was the predecessor's internal tmux option: --tmux makes the "
                    "panes itself"
                )
            if token.startswith("-") and token != "-":
                raise ConfigError(f"unknown option {one_line(flag, 60)} (see {self.prog} --help)")
        if extra:
            hint = (
                ": one prompt only, quote a prompt with spaces"
                if self.prog == "parallelhue"
                else ""
            )
            raise ConfigError(
                f"unexpected argument '{one_line(extra[0], 60)}'{hint} (see {self.prog} --help)"
            )
        return known


# --- value checkers -------------------------------------------------------------


def check_int(name: str, raw: str, low: int, high: int) -> int:
    try:
        value = int(raw.strip(), 10)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise ConfigError(f"{name} must be an integer from {low} to {high}, got '{one_line(raw)}'")
    return value


def check_float(name: str, raw: str, low: float, high: float, *, low_open: bool = False) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    too_low = value <= low if low_open else value < low
    if not math.isfinite(value) or too_low or value > high:
        bound = f"greater than {low:g}" if low_open else f"from {low:g}"
        raise ConfigError(f"{name} must be a number {bound} to {high:g}, got '{one_line(raw)}'")
    return value


def check_rate(name: str, raw: str) -> float:
    """Requests per second: a positive number, or inf (every request at once)."""
    if raw.strip().lower() in ("inf", "infinity"):
        return math.inf
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0 or value > MAX_REQUEST_RATE:
        raise ConfigError(
            f"{name} must be a number of requests per second greater than 0 to "
            f"{MAX_REQUEST_RATE:g}, or inf, got '{one_line(raw)}'"
        )
    return value


def check_switch(name: str, raw: str) -> bool:
    """An on/off variable: 1/true/yes/on or 0/false/no/off."""
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(
        f"{name} must be 1 or 0 (or true/false, yes/no, on/off), got '{one_line(raw)}'"
    )


def check_choice(name: str, raw: str, choices: Sequence[str]) -> str:
    value = raw.strip()
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, got '{one_line(raw)}'")
    return value


def _endpoint(name: str, raw: str, api: str | None) -> str:
    try:
        return completions_url(raw, api)
    except EndpointError as error:
        raise ConfigError(f"{name} {one_line(str(error), 300)}") from None


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


def _output_file(
    name: str, raw: str, suffixes: Sequence[str] | None = None, *, stdout: bool = False
) -> str:
    path = raw.strip()
    if not path:
        raise ConfigError(f"{name} needs a file name")
    if stdout and path == STDOUT:
        return STDOUT
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
        # utf-8-sig: a byte order mark (Windows editors) is not part of the first prompt.
        with open(path, encoding="utf-8-sig") as handle:
            content = handle.read()
    except FileNotFoundError:
        raise ConfigError(f"{name}: no such file {one_line(path)}") from None
    except IsADirectoryError:
        raise ConfigError(f"{name}: {one_line(path)} is a directory, give a file") from None
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


def _extra_body(raw: str) -> dict[str, Any]:
    example = """give a JSON object, e.g. '{"top_p": 0.9}'"""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ConfigError(
            f"--extra-body is not valid JSON ({error.msg} at line {error.lineno} column "
            f"{error.colno}): {example}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"--extra-body must be a JSON object, got a {type(data).__name__}: {example}"
        )
    reserved = [key for key in data if key in RESERVED_BODY_KEYS]
    if reserved:
        raise ConfigError(
            f"--extra-body may not set {', '.join(reserved)}: parallelhue sets "
            f"{', '.join(RESERVED_BODY_KEYS)} itself (they make the stream verifiable)"
        )
    return data


def _header(raw: str) -> tuple[str, str]:
    name, colon, value = raw.partition(":")
    name = name.strip()
    if not colon or not _HEADER_NAME.fullmatch(name):
        raise ConfigError(
            f"--header needs NAME:VALUE with a token NAME (e.g. --header 'X-Team: infra'), "
            f"got '{one_line(raw.split(':', 1)[0], 60)}{':…' if colon else ''}'"
        )
    if name.lower() in _RESERVED_HEADERS:
        raise ConfigError(f"--header {name} is set by parallelhue itself on every request: drop it")
    value = value.strip()
    if any(not ch.isprintable() for ch in value):
        # Header values are often secrets: never echo them.
        raise ConfigError(f"--header {name}: the value contains a control character")
    return name, value


# --- parsing --------------------------------------------------------------------


class Sources:
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


def common_flags(parser: argparse.ArgumentParser) -> None:
    """Flags a run and the demo share."""
    for flag in (
        "--view", "--mode", "--max-tokens", "--concurrency", "--socket-dir", "--seed",
        "--temperature", "--record", "--export", "--measurement", "--reconciler", "--prompt",
        "--telemetry", "--color", "--palette", "--system", "--extra-body", "--requests",
        "--request-rate", "--frequency-penalty", "--presence-penalty", "--repeat-penalty",
        "--start-delay",
    ):  # fmt: skip
        parser.add_argument(flag)
    parser.add_argument("--stop", action="append")
    parser.add_argument("--header", action="append")
    for flag in (
        "--tmux", "--no-tmux", "--no-attach", "--ignore-eos", "--json", "--force-full-length",
    ):  # fmt: skip
        parser.add_argument(flag, action="store_true", default=None)


def _run_parser() -> Parser:
    parser = Parser(prog="parallelhue", add_help=False)
    parser.add_argument("prompt_arg", nargs="?")
    for flag in ("--endpoint", "--api", "--model", "--prompt-file", "--api-key", "--timeout"):
        parser.add_argument(flag)
    parser.add_argument("--backend")
    parser.add_argument("--accept-uid", action="append")
    common_flags(parser)
    return parser


def _default_view(concurrency: int, stdout_tty: bool, env: Mapping[str, str]) -> str:
    if not stdout_tty or dumb_terminal(env):
        return "plain"
    return "stream" if concurrency == 1 else "grid"


def _sampling(
    src: Sources,
) -> tuple[dict[str, Any], bool, float | None, dict[str, float | None]]:
    """--extra-body, --force-full-length, --temperature and the penalties, in that order."""
    env = src.env
    args = src.args
    extra_body = _extra_body(args.extra_body) if args.extra_body is not None else {}
    force_full_length = bool(args.force_full_length)
    if not force_full_length and env.get("PARALLELHUE_FORCE_FULL_LENGTH", "").strip():
        raw = env["PARALLELHUE_FORCE_FULL_LENGTH"]
        force_full_length = check_switch("PARALLELHUE_FORCE_FULL_LENGTH", raw)
    got = src.get("--temperature", "PARALLELHUE_TEMPERATURE")
    temperature: float | None
    if got:
        temperature = check_float(got[0], got[1], 0.0, 100.0)
    elif "temperature" in extra_body:
        temperature = None  # --extra-body's stands
    else:
        temperature = 0.0 if force_full_length else DEFAULT_TEMPERATURE
    penalties: dict[str, float | None] = {}
    for key, low in (("frequency", -2.0), ("presence", -2.0), ("repeat", 0.0)):
        flag = f"--{key}-penalty"
        got = src.get(flag, f"PARALLELHUE_{key.upper()}_PENALTY")
        high = 2.0 if low < 0 else 100.0
        penalties[f"{key}_penalty"] = check_float(got[0], got[1], low, high) if got else None
    return extra_body, force_full_length, temperature, penalties


def _socket_dir(src: Sources) -> str | None:
    socket_dir: str | None = None
    got = src.get("--socket-dir", None)
    if got is not None:
        if not got[1].strip():
            raise ConfigError("--socket-dir needs a directory path")
        socket_dir = got[1]
    return socket_dir


def _prompt_extras(args: argparse.Namespace) -> tuple[tuple[str, ...], str | None]:
    """--stop and --system."""
    stop = tuple(args.stop or ())
    if any(not item for item in stop):
        raise ConfigError("--stop needs a non-empty string")
    system = args.system
    if system is not None and not system.strip():
        raise ConfigError("--system is empty: give the system prompt's text")
    return stop, system


def resolve_common(
    src: Sources,
    *,
    default_concurrency: int,
    concurrency_limit: int,
    warn_above: int | None,
    stdout_tty: bool,
) -> dict[str, Any]:
    """Settings shared by a normal run and the demo."""
    env = src.env
    args = src.args
    warnings: list[str] = []
    got = src.get("--max-tokens", "PARALLELHUE_MAX_TOKENS")
    max_tokens = check_int(got[0], got[1], 1, 1_000_000) if got else DEFAULT_MAX_TOKENS
    got_requests = src.get("--requests", "PARALLELHUE_REQUESTS")
    got = src.get("--concurrency", "PARALLELHUE_CONCURRENCY")
    concurrency = check_int(got[0], got[1], 1, concurrency_limit) if got else default_concurrency
    requests = concurrency
    if got_requests is not None:
        requests_name = got_requests[0]
        requests = check_int(requests_name, got_requests[1], 1, MAX_REQUESTS)
        if concurrency > requests:
            if got:
                raise ConfigError(
                    f"{got[0]} {concurrency} is more than {requests_name} {requests}: each "
                    f"stream needs a request; lower {got[0]} to {requests} or raise {requests_name}"
                )
            concurrency = requests  # the default concurrency never exceeds the requests
    got_rate = src.get("--request-rate", "PARALLELHUE_REQUEST_RATE")
    request_rate = check_rate(*got_rate) if got_rate else math.inf
    if got and warn_above is not None and concurrency > warn_above:
        warnings.append(
            f"{got[0]} {concurrency} is above {warn_above}: every stream runs, but only "
            f"the first {warn_above} get panes (the rest are overview lines)"
        )
    got = src.get("--mode", "PARALLELHUE_MODE")
    mode = check_choice(got[0], got[1], MODES) if got else "auto"
    json_output = bool(args.json)
    measurement = src.get("--measurement", None)
    measurement_path = _output_file(*measurement, stdout=True) if measurement else None
    if json_output and measurement_path == STDOUT:
        raise ConfigError(
            "--json and --measurement - both write to stdout: give --measurement a file name"
        )
    stdout_free = not (json_output or measurement_path == STDOUT)
    # With stdout taken by JSON the screen goes to stderr: its terminal decides the view.
    screen_tty = stdout_tty if stdout_free else sys.stderr.isatty()
    got = src.get("--view", "PARALLELHUE_VIEW")
    view = (
        check_choice(got[0], got[1], VIEWS) if got else _default_view(concurrency, screen_tty, env)
    )
    if got and view != "plain" and dumb_terminal(env):
        raise ConfigError(
            f"{got[0]} {view} moves the cursor, but TERM={env.get('TERM')} cannot: "
            "use --view plain or set TERM"
        )
    got = src.get("--reconciler", "PARALLELHUE_RECONCILER")
    reconciler = check_choice(got[0], got[1], RECONCILERS) if got else "rust"
    got = src.get("--telemetry", "PARALLELHUE_TELEMETRY")
    telemetry = check_choice(got[0], got[1], TELEMETRY) if got else "auto"
    got = src.get("--seed", "PARALLELHUE_SEED")
    seed = check_int(got[0], got[1], 0, MAX_SEED) if got else 0
    extra_body, force_full_length, temperature, penalties = _sampling(src)
    got = src.get("--start-delay", "PARALLELHUE_START_DELAY")
    start_delay = check_float(got[0], got[1], 0.0, MAX_START_DELAY) if got else 0.0
    got = src.get("--color", "PARALLELHUE_COLOR")
    color_by = check_choice(got[0], got[1], COLOR_MODES) if got else "step"
    got = src.get("--palette", "PARALLELHUE_PALETTE")
    palette = check_choice(got[0], got[1], PALETTE_NAMES) if got else "standard"
    socket_dir = _socket_dir(src)
    record = src.get("--record", None)
    export = src.get("--export", None)
    tmux = bool(args.tmux) and not args.no_tmux  # --no-tmux wins, as it did
    no_attach = bool(args.no_attach)
    if no_attach and not args.tmux:
        raise ConfigError("--no-attach only applies with --tmux")
    if tmux and shutil.which("tmux") is None:
        # The predecessor fell back to one terminal; so does this.
        warnings.append("--tmux: tmux is not on PATH: showing the run in this terminal instead")
        tmux = no_attach = False
    if view == "stream" and concurrency > 1:
        raise ConfigError(
            f"--view stream shows one stream, but {concurrency} streams were asked for: "
            "use --view grid or --concurrency 1"
        )
    stop, system = _prompt_extras(args)
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
        "measurement": measurement_path,
        "tmux": tmux,
        "no_attach": no_attach,
        "warnings": warnings,
        "stop": stop,
        "ignore_eos": bool(args.ignore_eos),
        "system": system,
        "extra_body": extra_body,
        "headers": tuple(_header(raw) for raw in args.header or ()),
        "color_by": color_by,
        "palette": palette,
        "json_output": json_output,
        "requests": requests,
        "request_rate": request_rate,
        **penalties,
        "force_full_length": force_full_length,
        "start_delay": start_delay,
    }


def _accept_uids(src: Sources, telemetry: str) -> tuple[int, ...]:
    """--accept-uid UID (repeatable) or PARALLELHUE_ACCEPT_UIDS=UID[,UID...]."""
    flags: list[str] | None = src.args.accept_uid
    if flags:
        given = [("--accept-uid", raw) for raw in flags]
    else:
        raw_env = src.env.get("PARALLELHUE_ACCEPT_UIDS", "")
        given = [("PARALLELHUE_ACCEPT_UIDS", part) for part in raw_env.split(",") if part.strip()]
    uids: list[int] = []
    for name, raw in given:
        uid = check_int(name, raw, 0, MAX_UID)
        if uid == os.geteuid():
            raise ConfigError(f"{name} {uid} is this client's own uid: it is always accepted")
        if uid not in uids:
            uids.append(uid)
    if uids and telemetry == "http":
        raise ConfigError(
            f"{given[0][0]} applies to the telemetry socket: not with --telemetry http"
        )
    return tuple(uids)


def no_color(env: Mapping[str, str]) -> bool:
    # https://no-color.org: present and not empty disables color; a dumb terminal has none.
    return bool(env.get("NO_COLOR")) or dumb_terminal(env)


def _fan_out(prompts: list[str], count: int, source: str, limit: str) -> list[str]:
    """One prompt per request: a single prompt is repeated, a list is cycled. `limit`
    names what sets the count (--concurrency, or --requests when given)."""
    if len(prompts) > count:
        raise ConfigError(
            f"{source} holds {len(prompts)} prompts but {limit} is {count}: "
            f"raise {limit} to {len(prompts)} or leave it out"
        )
    return [prompts[i % len(prompts)] for i in range(count)]


def _stdout_tty(value: bool | None) -> bool:
    return sys.stdout.isatty() if value is None else value


def parse_run(
    argv: Sequence[str], env: Mapping[str, str] | None = None, stdout_tty: bool | None = None
) -> RunConfig:
    """Validate a normal run's flags and environment."""
    env = os.environ if env is None else env
    args = _run_parser().parse_args(list(argv))
    src = Sources(args, env)

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
    common = resolve_common(
        src,
        default_concurrency=default_concurrency,
        concurrency_limit=HARD_CONCURRENCY_LIMIT,
        warn_above=MAX_CONCURRENCY,
        stdout_tty=_stdout_tty(stdout_tty),
    )
    count = int(common["requests"])
    if file_prompts is not None:
        assert prompt_file is not None
        got_requests = src.get("--requests", "PARALLELHUE_REQUESTS")
        limit = got_requests[0] if got_requests else "--concurrency"
        prompts = _fan_out(file_prompts, count, prompt_file[0], limit)
    elif single is not None:
        prompts = [single] * count
    else:
        raise ConfigError(
            "no prompt: give it as an argument, with --prompt, --prompt-file or PARALLELHUE_PROMPT"
        )

    got = src.get("--api", "PARALLELHUE_API")
    api = check_choice(got[0], got[1], APIS) if got else None
    got = src.get("--endpoint", "PARALLELHUE_ENDPOINT") or src.get("--endpoint", "OPENAI_BASE_URL")
    if got:
        endpoint = _endpoint(got[0], got[1], api)
    else:
        endpoint = completions_url(DEFAULT_BASE_URL, api)
    if common["system"] is not None and api_kind(endpoint) != "chat":
        raise ConfigError(
            "--system needs the chat API: give a .../v1/chat/completions endpoint or --api chat"
        )
    got = src.get("--model", "PARALLELHUE_MODEL")
    model = got[1].strip() if got else None
    if got and not model:
        raise ConfigError(f"{got[0]} is empty: give a model name or leave it out")
    # OPENAI_API_KEY wins over PARALLELHUE_API_KEY, as in the predecessor.
    got = src.get("--api-key", "OPENAI_API_KEY") or src.get("--api-key", "PARALLELHUE_API_KEY")
    api_key = _api_key(got[0], got[1]) if got else None
    got = src.get("--timeout", "PARALLELHUE_TIMEOUT")
    timeout = check_float(got[0], got[1], 0.0, 86400.0, low_open=True) if got else DEFAULT_TIMEOUT
    got = src.get("--backend", "PARALLELHUE_BACKEND")
    backend = _backend(got[0], got[1]) if got else "auto"
    accept_uids = _accept_uids(src, str(common["telemetry"]))

    return run_config(
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


def run_config(
    common: Mapping[str, Any],
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
        api_key=api_key,
        timeout=timeout,
        backend=backend,
        no_color=no_color(env),
        accept_uids=accept_uids,
        **common,
    )


def parse_replay(
    argv: Sequence[str], env: Mapping[str, str] | None = None, stdout_tty: bool | None = None
) -> ReplayConfig:
    """Validate `parallelhue replay FILE` flags."""
    env = os.environ if env is None else env
    parser = Parser(prog="parallelhue replay", add_help=False)
    parser.add_argument("file", nargs="?")
    for flag in ("--speed", "--view", "--export", "--reconciler", "--color", "--palette"):
        parser.add_argument(flag)
    parser.add_argument("--json", action="store_true", default=None)
    args = parser.parse_args(list(argv))
    if args.file is None:
        raise ConfigError("replay needs a recording: parallelhue replay FILE")
    if os.path.isdir(args.file):
        raise ConfigError(f"replay: {one_line(args.file)} is a directory, give a recording file")
    if not os.path.isfile(args.file):
        raise ConfigError(f"replay: no such file {one_line(args.file)}")
    speed = math.inf
    if args.speed is None:
        speed = 1.0
    elif args.speed.strip() != "max":
        speed = check_float("--speed", args.speed, 0.0, 1000.0, low_open=True)
    src = Sources(args, env)
    json_output = bool(args.json)
    screen_tty = _stdout_tty(stdout_tty) if not json_output else sys.stderr.isatty()
    got = src.get("--view", "PARALLELHUE_VIEW")
    if got:
        view = check_choice(got[0], got[1], VIEWS)
        if view != "plain" and dumb_terminal(env):
            raise ConfigError(
                f"{got[0]} {view} moves the cursor, but TERM={env.get('TERM')} cannot: "
                "use --view plain or set TERM"
            )
    else:
        view = "grid" if screen_tty and not dumb_terminal(env) else "plain"
    got = src.get("--reconciler", "PARALLELHUE_RECONCILER")
    reconciler = check_choice(got[0], got[1], RECONCILERS) if got else "rust"
    got = src.get("--color", "PARALLELHUE_COLOR")
    color_by = check_choice(got[0], got[1], COLOR_MODES) if got else "step"
    got = src.get("--palette", "PARALLELHUE_PALETTE")
    palette = check_choice(got[0], got[1], PALETTE_NAMES) if got else "standard"
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
        no_color=no_color(env),
        color_by=color_by,
        palette=palette,
        json_output=json_output,
    )
