"""The reference reconciler's state: constants, per-source and per-stream records, and
the helpers every rule uses (the Rust core's `reconcile/mod.rs`, `source.rs`).
"""

from __future__ import annotations

import re
import secrets
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from parallelhue.model.shapes import COUNTER_KEYS as _SHAPE_COUNTER_KEYS
from parallelhue.model.shapes import STAT_KEYS as _SHAPE_STAT_KEYS
from parallelhue.reference.decode import Frame
from parallelhue_vllm.wire import (
    FINISH_NAMES,
    ROLE_ACCEPTED,
    ROLE_BONUS,
    ROLE_PLAIN,
    ROLE_TARGET,
    SOURCE_FRONTEND,
    SOURCE_SCHEDULER,
    Hello,
)

REORDER_WINDOW = 64
MAX_STREAMS = 65535
U32_MAX = 0xFFFFFFFF
U64_MAX = 0xFFFFFFFFFFFFFFFF
LATE_MESSAGE = "telemetry arrived after the verdicts were final: not used (counted in late_frames)"
_RUN_ID = re.compile(r"[0-9a-f]{32}")

ROLE_NAMES = {SOURCE_SCHEDULER: "scheduler", SOURCE_FRONTEND: "frontend"}
ENGINE_NAMES = {1: "vllm", 2: "simulated"}
DERIVATION_NAMES = {0: "none", 1: "draft_ids", 2: "counts"}
VERIFICATION_NAMES = {0: "none", 1: "standard", 2: "synthetic", 3: "fly", 4: "unknown"}
TOKEN_ROLE_NAMES = {
    ROLE_PLAIN: "plain",
    ROLE_ACCEPTED: "accepted",
    ROLE_TARGET: "target",
    ROLE_BONUS: "bonus",
}
# The keys of stats and counters are defined once, in parallelhue.model.shapes
# (held equal to the Rust core's by tests/test_native_types.py).
STAT_KEYS = _SHAPE_STAT_KEYS
COUNTER_KEYS = _SHAPE_COUNTER_KEYS
LIST_KEYS = ("drafts_by_pos", "accepted_by_pos")
INPUT_SHAPES = (
    '("frame", bytes), ("sse", stream, text, token_ids), ("sse_id", stream, id), '
    '("sse_choice", stream, index), ("sse_usage", stream, completion_tokens, '
    'per_step_accepted, per_step_drafted) or ("finish", stream, finish_reason)'
)

Event = tuple[Any, ...]


class _Failed(Exception):
    """Raised inside per-stream processing to stop at the first failure."""


@dataclass
class _Source:
    source_id: int
    next_seq: int = 0
    buffered: dict[int, Frame] = field(default_factory=dict)
    # Keyed digest of every frame received, by seq: a duplicate must be byte-identical.
    digests: dict[int, bytes] = field(default_factory=dict)
    role: int | None = None  # set by its hello
    hello: Hello | None = None
    broken: bool = False  # first frame was not a hello: ignore the rest


@dataclass
class _ProvenanceStep:
    offset: int
    roles: list[int]
    drafts_scheduled: int
    drafts_padded: int
    ordinal: int
    trimmed: bool = False


@dataclass
class _Fragment:
    offset: int  # the token that carries the bytes
    span_back: int
    start: int  # byte positions in the stream's text
    end: int
    lead_len: int  # bytes from the span_back predecessors (LEAD_UNKNOWN: not known)
    # Each predecessor's give count, when all are known and add up to lead_len.
    gives: list[int] | None = None
    # The first token that may have given bytes: offset - span_back, or an earlier
    # pending token it does not claim whose give count is unknown.
    reach: int = 0


@dataclass
class _Piece:
    """A run of a fragment's characters attributed alike (byte range relative to it)."""

    start: int
    end: int
    step: int | None
    role: int | None
    first: int
    count: int


@dataclass
class _Stream:
    index: int
    verdict: str = "pending"
    reason: str | None = None
    # P: provenance
    p_source: int | None = None
    p_ids: list[int] = field(default_factory=list)
    p_ordinals: list[int] = field(default_factory=list)
    p_roles: list[int] = field(default_factory=list)
    p_steps: list[_ProvenanceStep] = field(default_factory=list)
    settled_steps: int = 0
    p_step: int | None = None  # header step of the last provenance record
    p_finished: int | None = None  # the scheduler's finish reason once finished
    p_trimmed: bool = False  # the last record was trimmed: nothing may follow
    # T: text
    t_source: int | None = None
    t_ids: list[int] = field(default_factory=list)
    t_finished: bool = False
    t_truncated: bool = False  # the final HTTP text stops inside or before the fragments
    t_stop_string: bool = False  # a stop string ended it: provenance beyond is surplus
    t_reason: int = 0
    t_trimmed_tokens: int = 0
    t_step: int | None = None
    trim_checked: bool = False  # a stop-string finish checked against the scheduler's step
    metrics_checked: bool = False  # vLLM's per-request metrics matched the records
    metrics_to_stop: bool = False  # ... matched them up to a stop string's last step
    # Give counts of the empty-fragment tokens since the last fragment (the tokens
    # just before t's end), in offset order.
    pending_gives: list[int] = field(default_factory=list)
    fragments: list[_Fragment] = field(default_factory=list)
    proven_fragments: int = 0
    proven_bytes: int = 0
    # (token end, HTTP byte end) of each text record the SSE has not passed yet, and
    # of each SSE chunk not yet held against them: a chunk carries whole steps.
    t_ends: deque[tuple[int, int]] = field(default_factory=deque)
    q_ends: deque[tuple[int, int]] = field(default_factory=deque)
    fragment_bytes: bytearray = field(default_factory=bytearray)  # F
    http_bytes: bytearray = field(default_factory=bytearray)  # H
    # Q and S: what the client's own SSE stream received
    q_ids: list[int] = field(default_factory=list)
    sse_bytes: bytearray = field(default_factory=bytearray)  # S
    sse_finished: bool = False
    sse_reason: str | None = None
    sse_id: str | None = None
    sse_choice: int | None = None
    # vLLM's per-request metrics (per_step_accepted, per_step_drafted) as first
    # received: kept, never replaced (evidence is monotone).
    metrics: tuple[list[int], list[int]] | None = None
    stats: dict[str, Any] = field(default_factory=lambda: _empty_stats())

    @property
    def confirmed_end(self) -> int:
        # Ids are compared as soon as two witnesses hold an offset and a mismatch fails
        # the stream, so while it is pending every offset all three hold is confirmed.
        return min(len(self.p_ids), len(self.t_ids), len(self.q_ids))

    @property
    def surplus_from(self) -> int | None:
        """First offset whose provenance is surplus, once the text ended on a stop string."""
        if self.t_finished and self.t_stop_string:
            return len(self.t_ids)
        return None


def _empty_stats() -> dict[str, Any]:
    stats: dict[str, Any] = dict.fromkeys(STAT_KEYS, 0)
    stats["hist"] = {}
    for key in LIST_KEYS:
        stats[key] = []
    return stats


def _add_lists(total: list[int], values: list[int]) -> None:
    """total += values element-wise, growing total to values' length."""
    total.extend([0] * (len(values) - len(total)))
    for index, value in enumerate(values):
        total[index] += value


# Said after the reason when the chunk id is the one vllm-router's P/D mode gives both
# stages (docs/REACH.md): the router renamed the request, no server bug.
PD_ROUTER_NOTE = " (a prefill/decode router renamed the request)"


def _is_pd_router_id(chunk_id: str) -> bool:
    """vllm-router's P/D request id, `___prefill_addr_<url>___decode_addr_<url>_<uuid>`."""
    _, found, rest = chunk_id.partition("___prefill_addr_")
    return bool(found) and "___decode_addr_" in rest


def _carries_request_id(chunk_id: str, request_id: str) -> bool:
    """`chunk_id` holds `request_id` not followed by another digit."""
    start = chunk_id.find(request_id)
    while start >= 0:
        after = chunk_id[start + len(request_id) : start + len(request_id) + 1]
        if not (after and after in "0123456789"):
            return True
        start = chunk_id.find(request_id, start + 1)
    return False


def _finish_name(code: int) -> str:
    return "none" if code == 0 else FINISH_NAMES.get(code, "error")


def _check_u32_list(values: list[int] | None) -> None:
    for value in values or ():
        if not 0 <= value <= U32_MAX:
            raise ValueError(f"per-step count {value} out of range 0..=4294967295")


class ReconcilerState:
    """The run's state; the rules are layered on it in the modules of this package."""

    def __init__(self, run_id: str, num_streams: int) -> None:
        if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
            raise ValueError(f"invalid run id '{run_id}': expected 32 lowercase hex characters")
        if not 1 <= num_streams <= MAX_STREAMS:
            raise ValueError(f"num_streams {num_streams} out of range 1..=65535")
        self.run_id = run_id
        self.num_streams = num_streams
        self._run_bytes = bytes.fromhex(run_id)
        self._streams = [_Stream(i) for i in range(num_streams)]
        self._sources: dict[int, _Source] = {}
        self._hellos: list[dict[str, object]] = []
        self._events: list[Event] = []
        # Index of the first event produced by the input being processed: only
        # spans of the same input are merged, so merging never depends on drains.
        self._input_start = 0
        self._counters = dict.fromkeys(COUNTER_KEYS, 0)
        self._admitted_any = False
        self._finalized = False  # finalize() ran: nothing changes any more
        # The key of the duplicate digests: random, so a sender cannot craft a collision.
        self._digest_key = secrets.token_bytes(16)

    def _check_stream_index(self, stream: int) -> None:
        if not 0 <= stream < self.num_streams:
            raise ValueError(f"stream {stream} out of range 0..{self.num_streams}")

    def _reject(self, message: str) -> None:
        self._counters["rejected_frames"] += 1
        self._events.append(("run", f"rejected frame: {message}"))

    def _set_failed(self, state: _Stream, reason: str) -> None:
        """Fail a pending stream, or revoke an exact one (before finalize)."""
        state.verdict = "failed"
        state.reason = reason
        self._events.append(("failed", state.index, reason))

    def _fail(self, state: _Stream, reason: str) -> _Failed:
        self._set_failed(state, reason)
        return _Failed(reason)

    @staticmethod
    def _has_metrics(state: _Stream) -> bool:
        return state.metrics is not None
