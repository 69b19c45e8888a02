"""The shapes of what crosses the reconciler's boundary, defined once.

Both reconcilers (the Rust core through `parallelhue._native`, and the
pure-Python reference) hand the client these statistics, counters, sources,
events and stream ends. The Rust side exports its key lists
(`_native.STAT_KEYS`, `COUNTER_KEYS`, `SOURCE_KEYS`, `RECEIVER_KEYS`,
`END_KINDS`); tests/test_native_types.py holds them equal to the keys here,
and the reference builds its dicts from these keys, so no list is copied by
hand. Also the plain data the screen model shares with the fetchers
(`MetricsSnapshot`, filled by metrics.py). Nothing here imports anything of
the client, so the screen model can import it without the HTTP client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias, TypedDict, get_args

__all__ = [
    "COUNTER_KEYS",
    "END_KINDS",
    "STAT_KEYS",
    "Counters",
    "EndKind",
    "Event",
    "ExactEvent",
    "FailedEvent",
    "MetricsSnapshot",
    "ReceiverStats",
    "RunEvent",
    "SourceInfo",
    "SpanEvent",
    "StreamStats",
    "TelemetryState",
    "Usage",
]

# Prometheus families of vLLM's speculative decoding share this prefix; all of vLLM's
# families share the shorter one.
SPEC_DECODE_PREFIX = "vllm:spec_decode"
VLLM_PREFIX = "vllm:"


@dataclass(frozen=True)
class MetricsSnapshot:
    """The counters of one /metrics page (metrics.py scrapes and parses it)."""

    samples: dict[str, float]  # counter sample name -> value summed over label sets
    families: frozenset[str]

    @property
    def has_spec_decode(self) -> bool:
        return any(name.startswith(SPEC_DECODE_PREFIX) for name in self.families)


class StreamStats(TypedDict):
    """`stream_stats(i)`; `totals()` has the same keys, summed over the streams."""

    tokens: int
    steps: int
    hist: dict[int, int]  # confirmed tokens in a settled record -> records
    drafts_scheduled: int
    drafts_padded: int
    plain: int
    accepted: int
    target: int
    bonus: int
    surplus_tokens: int
    surplus_accepted: int
    surplus_target: int
    surplus_bonus: int
    surplus_plain: int
    mixed_spans: int
    bytes: int
    drafts_by_pos: list[int]  # settled drafts per draft position 0..K-1
    accepted_by_pos: list[int]  # of them, accepted
    metrics_steps: int  # steps cross-checked with vLLM's per-request metrics


class Counters(TypedDict):
    frames: int
    rejected_frames: int
    duplicate_frames: int
    foreign_records: int
    dropped_reported: int
    gaps: int
    late_frames: int  # frames after finalize(): counted, not used


class SourceInfo(TypedDict):
    """One hello seen."""

    source_id: int
    role: Literal["scheduler", "frontend"]
    engine: Literal["vllm", "simulated"]
    role_derivation: Literal["none", "draft_ids", "counts"]
    async_scheduling: bool
    num_speculative_tokens: int
    plugin_version: str
    engine_version: str
    spec_method: str
    verification: Literal["none", "standard", "synthetic", "fly", "unknown"]


class ReceiverStats(TypedDict):
    """The Rust telemetry receiver's counters."""

    datagrams: int
    bytes: int
    rejected_uid: int
    last_rejected_uid: int | None  # the uid of the last one rejected for its uid
    accepted_foreign: int  # admitted because --accept-uid named their uid
    oversized: int
    batches: int
    errors: int
    rcvbuf: int


class TelemetryState(TypedDict):
    """The HTTP telemetry stream of a run as the Rust HTTP thread has seen it."""

    subscribed: bool
    run_id: str | None  # from the preamble: the run the server created
    buffer_bytes: int | None
    heartbeat_ms: int | None
    accepted: bool  # the client took the run: frames go into the reconciler
    frames: int
    bytes: int
    dropped: int  # frames the server's hub discarded for this client
    heartbeats: int
    # How it ended, None while open: (an EndKind, or "server_end" (status: the end
    # item's code), "stream" (its framing error) ..., status, detail).
    end: tuple[str, int, str] | None


class Usage(TypedDict):
    """The usage chunk of a stream, when the server sent one."""

    prompt_tokens: int | None
    completion_tokens: int | None
    total_tokens: int | None


# drain() events, in the order they happened.
# ("span", stream, byte_start, text, step index or None (mixed), first_offset, n_tokens,
#  role or None: 0 plain, 1 accepted, 2 target, 3 bonus, when the characters share one)
SpanEvent: TypeAlias = tuple[Literal["span"], int, int, str, int | None, int, int, int | None]
ExactEvent: TypeAlias = tuple[Literal["exact"], int]
FailedEvent: TypeAlias = tuple[Literal["failed"], int, str]
RunEvent: TypeAlias = tuple[Literal["run"], str]
Event: TypeAlias = SpanEvent | ExactEvent | FailedEvent | RunEvent

# How a stream's HTTP exchange ended when it did not end normally (the Rust
# core's `outcome::EndKind`, in code order); stream_errors.end_message says
# what each means to the user.
EndKind: TypeAlias = Literal[
    "no_finish",
    "refused",
    "connect_failed",
    "connect_timeout",
    "read_timeout",
    "closed",
    "no_response",
    "framing",
    "protocol",
    "bad_sse",
    "http_status",
    "not_sse",
    "encoding",
    "tls",
    "io",
    "internal",
    "cancelled",
]

STAT_KEYS: tuple[str, ...] = tuple(StreamStats.__annotations__)
COUNTER_KEYS: tuple[str, ...] = tuple(Counters.__annotations__)
END_KINDS: tuple[str, ...] = get_args(EndKind)
