"""Configuration of the simulated engine and of the faults it can inject."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from parallelhue_vllm.hub import HubLimits

__all__ = ["STOCK_SERVERS", "FaultConfig", "SimConfig", "acceptance_for_stream"]

MAX_DRAFT_LEN = 16
# The stock servers the engine can play (no plugin frames; their own step reports).
STOCK_SERVERS = ("vllm", "llamacpp")
# Where telemetry goes: the client's socket, in-band (through the hub), or both.
TELEMETRY_MODES = ("socket", "http", "both")


@dataclass(slots=True)
class FaultConfig:
    """Faults injected at the sending side, for tests and demonstrations.

    Datagram faults act on the frames after the emitter assigned their
    sequence numbers (a proxy socket between the emitters and the client),
    so they look exactly like losses in transit. Each has a probability per
    data frame; `skip_frames` data frames of each source pass untouched first
    and `max_per_fault` (0 = unlimited) caps how often each fault fires.
    Content faults fire once, on `target_stream`, at the first step whose
    tokens start at or after `target_offset`.
    """

    seed: int = 0
    skip_frames: int = 2
    max_per_fault: int = 0
    # datagram faults (probability per data frame)
    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    truncate: float = 0.0
    oversize: float = 0.0
    foreign_run: float = 0.0
    delay_ms: float = 0.0
    # one datagram from uid 65534 (needs root; ignored otherwise)
    other_uid: bool = False
    # In-band telemetry faults (sim/stream_faults.py, after the hub): once a response
    # carried `skip_frames` frames, its claim overflows by `stream_drop` frames as a
    # full hub buffer would; its telemetry ends as if the hub shut down (`stream_end`);
    # or its connection closes without the end item (`stream_close`).
    stream_drop: int = 0
    stream_end: bool = False
    stream_close: bool = False
    # content faults (once)
    sse_byte: bool = False
    fragment_byte: bool = False
    sse_token_id: bool = False
    frame_token_id: bool = False
    reasoning: bool = False
    # --stock faults on `target_stream`: the server's own step statements contradict
    # its chunks (vLLM: one accepted draft moved between two listed steps, sums kept;
    # llama-server: a verify step's accepted count bumped one token late), and
    # vLLM's chunks merged `merge` steps at a time (its API server stalled).
    reported_lie: bool = False
    merge: int = 0
    target_stream: int = 0
    target_offset: int = 3

    def validate(self) -> None:
        for name in ("drop", "duplicate", "reorder", "truncate", "oversize", "foreign_run"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0 or math.isnan(value):
                raise ValueError(
                    f"fault {_spec_name(name)} must be a probability in 0..1, got {value}"
                )
        if not 0.0 <= self.delay_ms <= 10_000.0:
            raise ValueError(f"fault delay must be 0..10000 ms, got {self.delay_ms}")
        for name in (
            "skip_frames",
            "max_per_fault",
            "target_stream",
            "target_offset",
            "stream_drop",
            "merge",
        ):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"fault {_spec_name(name)} must be >= 0, got {getattr(self, name)}"
                )

    @property
    def datagram_faults(self) -> bool:
        """Whether frames must pass the fault proxy."""
        return any(
            getattr(self, name) > 0
            for name in (
                "drop",
                "duplicate",
                "reorder",
                "truncate",
                "oversize",
                "foreign_run",
                "delay_ms",
            )
        )

    @property
    def stream_faults(self) -> bool:
        """Whether in-band telemetry must alter its responses."""
        return self.stream_drop > 0 or self.stream_end or self.stream_close

    @classmethod
    def parse(cls, spec: str) -> FaultConfig:
        """Parse `drop:0.01,sse-byte,delay:20` (names as in docs/SIMULATOR.md).

        Raises ValueError with a one-line message naming the valid choices.
        """
        config = cls()
        kinds = {item.name: item.type for item in fields(cls)}
        for raw_item in spec.split(","):
            item = raw_item.strip()
            if not item:
                continue
            name, _, raw_value = item.partition(":")
            attribute = name.strip().replace("-", "_")
            if attribute == "delay":
                attribute = "delay_ms"
            if attribute not in kinds:
                choices = ", ".join(sorted(_spec_name(key) for key in kinds))
                raise ValueError(f"unknown fault '{name.strip()}': choose from {choices}")
            kind = kinds[attribute]
            try:
                if kind in ("bool", bool):
                    value: object = raw_value.strip().lower() not in ("0", "false", "no", "off")
                elif kind in ("int", int):
                    value = int(raw_value) if raw_value else 1
                else:
                    value = float(raw_value) if raw_value else 1.0
            except ValueError:
                raise ValueError(
                    f"fault {_spec_name(attribute)} needs a number, got '{raw_value}'"
                ) from None
            setattr(config, attribute, value)
        config.validate()
        return config


def _spec_name(attribute: str) -> str:
    return "delay" if attribute == "delay_ms" else attribute.replace("_", "-")


@dataclass(slots=True)
class SimConfig:
    """How the simulated engine behaves. All of its numbers are simulated."""

    draft_len: int = 4
    # None: a spread of rates over streams; a float: every stream; a list: per stream, cycled.
    acceptance: float | list[float] | None = None
    step_ms: float = 20.0
    seed: int = 0
    socket_dir: str | None = None
    telemetry: bool = True
    # socket: frames to the client's <run>.sock; http: in-band, in each request's response
    # streams them (through a hub, as in the vLLM plugin); both.
    telemetry_mode: str = "socket"
    # Bearer tokens required on every /v1 route (vLLM's --api-key); empty = none.
    api_keys: tuple[str, ...] = ()
    hub_limits: HubLimits = field(default_factory=HubLimits)
    # Hub base directory (default: parallelhue_vllm.hub.base_dir()).
    hub_dir: str | None = None
    # Multi-node data parallel with a headless EngineCore on another host
    # (docs/REACH.md): the scheduler's emitter runs there and sees only that
    # host's hub directory (this path; no API server, so no hub), never this
    # process's hub or the client's socket. The detokenizer's frames stay here.
    remote_engine_hub_dir: str | None = None
    faults: FaultConfig | None = None
    host: str = "127.0.0.1"
    port: int = 0
    # probability that a decode step has no drafts (an n-gram lookup without a match)
    no_draft_rate: float = 0.08
    default_max_tokens: int = 256
    max_model_len: int = 8192
    emitter_queue_size: int = 8192
    # How long the emitters' sender threads wait for a full receiver queue.
    send_timeout: float = 2.0
    log_requests: bool = False
    # At most one SSE chunk per connection per this many ms (0: one per step);
    # the steps in between are merged, as vLLM's collector merges them.
    sse_interval_ms: float = 0.0
    # Play a stock server without our plugin (STOCK_SERVERS): no telemetry frames;
    # vLLM's per-step lists in the final usage chunk, or llama-server's per-token
    # chunks with cumulative `timings`.
    stock: str | None = None
    # Benchmarks: hold the first step until this many requests are in (at most
    # min_batch_wait seconds), and report the steps run with a full batch.
    min_batch: int = 1
    min_batch_wait: float = 10.0
    model: str = "parallelhue-sim"

    def validate(self) -> None:
        """Raise ValueError with a one-line message naming the fix."""
        if not 0 <= self.draft_len <= MAX_DRAFT_LEN:
            raise ValueError(f"draft length must be 0..{MAX_DRAFT_LEN}, got {self.draft_len}")
        rates: list[float]
        if self.acceptance is None:
            rates = []
        elif isinstance(self.acceptance, list):
            if not self.acceptance:
                raise ValueError("acceptance list is empty: give at least one rate in 0..1")
            rates = self.acceptance
        else:
            rates = [self.acceptance]
        for rate in rates:
            if not 0.0 <= rate <= 1.0 or math.isnan(rate):
                raise ValueError(f"acceptance must be in 0..1, got {rate}")
        if not 0.0 <= self.step_ms <= 10_000.0 or math.isnan(self.step_ms):
            raise ValueError(f"step time must be 0..10000 ms, got {self.step_ms}")
        if not 0.0 <= self.no_draft_rate <= 1.0:
            raise ValueError(f"no-draft rate must be in 0..1, got {self.no_draft_rate}")
        if not 1 <= self.default_max_tokens <= self.max_model_len:
            raise ValueError(
                f"default max tokens must be 1..{self.max_model_len}, got {self.default_max_tokens}"
            )
        if not 0.0 <= self.sse_interval_ms <= 10_000.0 or math.isnan(self.sse_interval_ms):
            raise ValueError(f"SSE interval must be 0..10000 ms, got {self.sse_interval_ms}")
        if not 1 <= self.min_batch <= 65535:
            raise ValueError(f"min batch must be 1..65535, got {self.min_batch}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0..65535, got {self.port}")
        if self.stock is not None and self.stock not in STOCK_SERVERS:
            raise ValueError(
                f"stock server must be one of {', '.join(STOCK_SERVERS)}, got '{self.stock}'"
            )
        if self.stock is not None and self.telemetry:
            raise ValueError("a stock server sends no telemetry: leave telemetry off with --stock")
        if self.telemetry_mode not in TELEMETRY_MODES:
            raise ValueError(
                f"telemetry mode must be one of {', '.join(TELEMETRY_MODES)}, "
                f"got '{self.telemetry_mode}'"
            )
        for key in self.api_keys:
            if not key or any(c.isspace() for c in key):
                raise ValueError("an API key must be non-empty and without whitespace")
        if self.faults is not None:
            self.faults.validate()
            if self.faults.datagram_faults and self.telemetry_mode == "http":
                raise ValueError(
                    "datagram faults act on the socket path: use --telemetry socket or both"
                )
            if self.faults.stream_faults and self.telemetry_mode == "socket":
                raise ValueError(
                    "stream faults act on in-band telemetry: use --telemetry http or both"
                )


def acceptance_for_stream(acceptance: float | list[float] | None, stream: int) -> float:
    """A stream's draft acceptance probability.

    The default spread (golden-ratio steps over 0.35..0.95) gives neighbouring
    streams clearly different rhythms in the grid.
    """
    if acceptance is None:
        return 0.35 + 0.6 * ((stream * 0.6180339887) % 1.0)
    if isinstance(acceptance, list):
        return acceptance[stream % len(acceptance)]
    return acceptance
