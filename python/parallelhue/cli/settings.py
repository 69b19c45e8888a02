"""The validated settings of a run and of a replay (what `config.py` parses into).

Plain frozen dataclasses, with the limits they are checked against: the
session, the views and the outputs read these, never argparse or the
environment. The demo's own settings (the simulated engine's knobs) live with
the demo (`demo.py`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "COLOR_MODES",
    "DEFAULT_BASE_URL",
    "DEFAULT_ENDPOINT",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_TEMPERATURE",
    "DEFAULT_TIMEOUT",
    "HARD_CONCURRENCY_LIMIT",
    "MAX_CONCURRENCY",
    "MAX_REQUESTS",
    "MAX_REQUEST_RATE",
    "MAX_SEED",
    "MAX_START_DELAY",
    "MAX_UID",
    "MODES",
    "PALETTE_NAMES",
    "RECONCILERS",
    "STDOUT",
    "TELEMETRY",
    "VIEWS",
    "ReplayConfig",
    "RunConfig",
    "dumb_terminal",
]

# Where a run goes without --endpoint, PARALLELHUE_ENDPOINT or OPENAI_BASE_URL.
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
DEFAULT_ENDPOINT = DEFAULT_BASE_URL + "/chat/completions"
DEFAULT_MAX_TOKENS = 128
DEFAULT_TIMEOUT = 60.0
# The predecessor's default; 0 with --force-full-length (its PARALLELHUE_FORCE_FULL_LENGTH).
DEFAULT_TEMPERATURE = 0.8
MAX_START_DELAY = 3600.0
# The grid shows up to this many panes; more streams run (overview lines, a warning).
MAX_CONCURRENCY = 64
# Beyond this a run is almost certainly a typo; the wire format allows 65535.
HARD_CONCURRENCY_LIMIT = 1024
MAX_SEED = 2**32 - 1
# --requests: the reconciler tracks each request as a stream of its own (u16 stream index).
MAX_REQUESTS = 65535
# --request-rate, requests per second (`inf`: every request as soon as a stream is free).
MAX_REQUEST_RATE = 1_000_000.0
MODES = ("exact", "auto", "chunk")
VIEWS = ("stream", "grid", "plain")
RECONCILERS = ("rust", "python")
TELEMETRY = ("auto", "socket", "http")  # telemetry.TELEMETRY_CHOICES
MAX_UID = 2**32 - 2  # (uid_t)-1 means "no uid"
COLOR_MODES = ("step", "role")
PALETTE_NAMES = ("standard", "colorblind")
# `--measurement -`: the record goes to stdout.
STDOUT = "-"


@dataclass(frozen=True)
class RunConfig:
    endpoint: str  # the full completions URL (endpoint.completions_url)
    model: str | None
    prompts: list[str]  # one per request, already fanned out (`requests` of them)
    max_tokens: int
    concurrency: int  # streams open at once
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
    measurement: str | None  # a path, or STDOUT
    reconciler: str
    no_color: bool
    warnings: list[str] = field(default_factory=list)
    telemetry: str = "auto"  # telemetry.TELEMETRY_CHOICES
    accept_uids: tuple[int, ...] = ()  # --accept-uid: socket senders besides our own uid
    # What each request asks for besides the prompt (request.py builds the body).
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    system: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    headers: tuple[tuple[str, str], ...] = ()
    # How the screen shows it.
    color_by: str = "step"
    palette: str = "standard"
    json_output: bool = False  # --json: the results on stdout, the screen on stderr
    # --requests: requests in the whole run (>= concurrency; a new one starts when one
    # ends); --request-rate: their Poisson arrival rate per second (inf: no waiting).
    requests: int = 1
    request_rate: float = math.inf
    # The predecessor's sampling knobs (PARALLELHUE_*_PENALTY): None leaves the field out.
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repeat_penalty: float | None = None  # llama.cpp's name, sent as given
    # PARALLELHUE_FORCE_FULL_LENGTH: ignore_eos with min_tokens = max_tokens (and
    # temperature 0 unless given): every stream runs to max_tokens.
    force_full_length: bool = False
    # PARALLELHUE_START_DELAY: seconds between the screen coming up and the first request.
    start_delay: float = 0.0

    @property
    def stdout_reserved(self) -> bool:
        """stdout carries JSON: the human output goes to stderr."""
        return self.json_output or self.measurement == STDOUT


@dataclass(frozen=True)
class ReplayConfig:
    path: str
    speed: float  # math.inf: no waiting
    view: str
    export: str | None
    reconciler: str
    no_color: bool
    color_by: str = "step"
    palette: str = "standard"
    json_output: bool = False

    @property
    def stdout_reserved(self) -> bool:
        return self.json_output


def dumb_terminal(env: Mapping[str, str] | None = None) -> bool:
    """TERM=dumb (or unknown): no cursor movement, no alternate screen, no colors."""
    return (os.environ if env is None else env).get("TERM", "") in ("dumb", "unknown")
