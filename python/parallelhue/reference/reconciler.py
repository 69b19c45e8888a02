"""Pure-Python reference reconciler (docs/PROTOCOL.md, "Reconciliation").

This is the oracle the Rust reconciler is checked against, so it is written to
be read next to the protocol text: one small method per rule, no caching
beyond what the rules themselves describe.

Readings of the protocol text that this file commits to (the wording is quoted
where it was open to more than one reading):

- `frames` counts every datagram passed to push_frame/push_frames.
- "rejected frame: …" messages are emitted as ("run", message) events and
  counted in `rejected_frames`; duplicates and foreign records are counters only.
- A second hello from a source is rejected: counted in `rejected_frames`, event
  `rejected frame: second hello from source {id:016x}`.
- A source whose first released frame is not a hello is a run-level failure:
  ("run", "source {id:016x}: {kind} frame before its hello"), every pending
  stream fails with that message, and its later frames are ignored.
- A run-level failure (wrong kind for the source's role, missing hello) emits
  a ("run", message) event, then fails every pending stream with the message.
  Frames lost (dropped counter, gap) fail the pending streams without a run event.
- "every stream of the run that is not yet complete" means every stream
  without a verdict yet.
- After a gap the source resumes at its lowest buffered sequence number.
- A failed stream's later inputs are ignored (its statistics stop changing
  too). An exact stream still takes provenance records (surplus, or a
  contradiction that revokes it), notices and run-level failures until
  `finalize()`; after `finalize()` nothing changes.
- A provenance step ordinal is the index of the provenance record within the
  stream. Ids are compared scheduler vs detokenizer and detokenizer vs SSE only
  (there is no scheduler-vs-SSE message); within a record, tokens are checked
  one by one in order: against the other witnesses, then span_back.
- "byte mismatch at offset {o}": {o} is the offset of the token that carries
  the fragment (the last of its span_back group).
- On settling, `hist[confirmed tokens] += 1` also for a record with no
  confirmed tokens (hist[0]).
- finalize rule 1 does not count a gap in `gaps`; sources are examined in the
  order their first frame was admitted. If no rule matches, rule 9 applies.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from parallelhue.model.shapes import COUNTER_KEYS as _SHAPE_COUNTER_KEYS
from parallelhue.model.shapes import STAT_KEYS as _SHAPE_STAT_KEYS
from parallelhue.reference.decode import Frame, FrameError, decode_frame
from parallelhue.reference.sse import shown_reason
from parallelhue_vllm.wire import (
    ALL_STREAMS,
    FINISH_LENGTH,
    FINISH_NAMES,
    KIND_HELLO,
    KIND_NAMES,
    KIND_PROVENANCE,
    KIND_TEXT,
    LEAD_UNKNOWN,
    ROLE_ACCEPTED,
    ROLE_BONUS,
    ROLE_PLAIN,
    ROLE_TARGET,
    SOURCE_FRONTEND,
    SOURCE_SCHEDULER,
    Hello,
    NoticeRecord,
    ProvenanceRecord,
    TextRecord,
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


class Reconciler:
    """Joins scheduler provenance, detokenizer text and the client's SSE stream per stream."""

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

    # ----------------------------------------------------------------- API

    def push_frame(self, frame: bytes) -> None:
        self._input_start = len(self._events)
        self._counters["frames"] += 1
        if self._finalized:
            self._counters["late_frames"] += 1
            if self._counters["late_frames"] == 1:
                self._events.append(("run", LATE_MESSAGE))
            return
        try:
            decoded = decode_frame(bytes(frame))
        except FrameError as error:
            self._reject(str(error))
            return
        if decoded.header.run_id != self._run_bytes:
            self._reject(f"frame for run {decoded.header.run_id.hex()}, expected {self.run_id}")
            return
        self._admitted_any = True
        self._admit(decoded, bytes(frame))

    def push_frames(self, frames: list[bytes]) -> None:
        for frame in frames:
            self.push_frame(frame)

    def push_inputs(self, inputs: list[tuple[Any, ...]]) -> None:
        """Several inputs, in order, exactly as the single calls (INPUT_SHAPES)."""
        for item in inputs:
            if isinstance(item, tuple) and item and isinstance(item[0], str):
                kind, size = item[0], len(item)
                if kind == "frame" and size == 2:
                    self.push_frame(item[1])
                    continue
                if kind == "sse" and size == 4:
                    self.push_sse(item[1], item[2], item[3])
                    continue
                if kind == "sse_id" and size == 3:
                    self.push_sse_id(item[1], item[2])
                    continue
                if kind == "sse_choice" and size == 3:
                    self.push_sse_choice(item[1], item[2])
                    continue
                if kind == "sse_usage" and size == 5:
                    self.push_sse_usage(item[1], item[2], item[3], item[4])
                    continue
                if kind == "finish" and size == 3:
                    self.finish_sse(item[1], item[2])
                    continue
            raise ValueError(f"invalid input {item!r}: expected {INPUT_SHAPES}")

    def _sse_state(self, stream: int) -> _Stream | None:
        """The stream an SSE input is for, while its verdict may change and its SSE
        body has not ended (SSE data after the end is a contradiction)."""
        self._input_start = len(self._events)
        state = self._streams[stream]
        if self._finalized or state.verdict == "failed":
            return None
        if state.sse_finished:
            self._set_failed(state, f"stream {stream}: SSE data after the stream finished")
            return None
        return state

    def push_sse(self, stream: int, text: str, token_ids: list[int]) -> None:
        self._check_stream_index(stream)
        for token_id in token_ids:
            if not 0 <= token_id <= U32_MAX:
                raise ValueError(f"token id {token_id} out of range 0..=4294967295")
        state = self._sse_state(stream)
        if state is None:
            return
        try:
            p_closed = state.p_finished is not None or state.p_trimmed
            for token_id in token_ids:
                offset = len(state.q_ids)
                if p_closed and offset >= len(state.p_ids):
                    raise self._fail(
                        state,
                        f"stream {stream}: SSE token at offset {offset} after the scheduler's "
                        f"last step ended at offset {len(state.p_ids)}",
                    )
                if state.t_finished and offset >= len(state.t_ids):
                    raise self._fail(
                        state,
                        f"stream {stream}: SSE token at offset {offset} after the detokenizer "
                        f"finished at offset {len(state.t_ids)}",
                    )
                state.q_ids.append(token_id)
                if offset < len(state.t_ids) and state.t_ids[offset] != token_id:
                    raise self._fail(
                        state,
                        f"token mismatch at offset {offset}: "
                        f"detokenizer {state.t_ids[offset]}, SSE {token_id}",
                    )
            state.sse_bytes += text.encode("utf-8")
            if text or token_ids:
                state.q_ends.append((len(state.q_ids), len(state.sse_bytes)))
            self._check_sse_within_http(state)
            self._progress(state)
        except _Failed:
            pass

    def push_sse_id(self, stream: int, chunk_id: str) -> None:
        """The SSE chunk `id` (the first chunk's, and each one differing from the previous)."""
        self._check_stream_index(stream)
        if not isinstance(chunk_id, str):
            raise TypeError(f"chunk id must be a string, not {type(chunk_id).__name__}")
        state = self._sse_state(stream)
        if state is None:
            return
        request_id = f"ph1_{self.run_id}_{stream}"
        if not _carries_request_id(chunk_id, request_id):
            self._set_failed(
                state, f"stream {stream}: SSE chunk id does not carry the request id {request_id}"
            )
        elif state.sse_id is not None and state.sse_id != chunk_id:
            self._set_failed(state, f"stream {stream}: SSE chunk id changed mid-stream")
        else:
            state.sse_id = chunk_id

    def push_sse_choice(self, stream: int, index: int) -> None:
        """The stream's chunks carried a choice other than the single choice 0: another
        choice's text may be in what the client showed."""
        self._check_stream_index(stream)
        if not 0 <= index <= U32_MAX:
            raise ValueError(f"choice index {index} out of range 0..=4294967295")
        state = self._sse_state(stream)
        if state is None:
            return
        self._set_failed(
            state,
            f"stream {stream}: SSE chunk with a choice other than the single choice 0 "
            f"(index {index})",
        )

    def push_sse_usage(
        self,
        stream: int,
        completion_tokens: int | None,
        per_step_accepted: list[int] | None,
        per_step_drafted: list[int] | None,
    ) -> None:
        """The usage chunk: `usage.completion_tokens` and vLLM's per-request metrics."""
        self._check_stream_index(stream)
        if completion_tokens is not None and not 0 <= completion_tokens <= U64_MAX:
            raise ValueError(
                f"completion_tokens {completion_tokens} out of range 0..=18446744073709551615"
            )
        _check_u32_list(per_step_accepted)
        _check_u32_list(per_step_drafted)
        state = self._sse_state(stream)
        if state is None:
            return
        try:
            self._usage_rules(state, completion_tokens, per_step_accepted, per_step_drafted)
            self._metrics_rules(state)
        except _Failed:
            pass

    def _usage_rules(
        self,
        state: _Stream,
        completion_tokens: int | None,
        accepted: list[int] | None,
        drafted: list[int] | None,
    ) -> None:
        """One usage statement, checked as it arrives and kept (evidence is monotone):
        `completion_tokens` counts the SSE tokens so far; the per-step lists come as a
        pair, and once received they never change (a usage chunk without them says
        nothing about them)."""
        stream = state.index
        if completion_tokens is not None and completion_tokens != len(state.q_ids):
            raise self._fail(
                state,
                f"stream {stream}: usage.completion_tokens {completion_tokens}, but the SSE "
                f"carried {len(state.q_ids)} tokens",
            )
        if accepted is None and drafted is None:
            return
        prefix = f"stream {stream}: vLLM's per-request metrics"
        if drafted is None:
            raise self._fail(state, f"{prefix} carry per_step_accepted without per_step_drafted")
        if accepted is None:
            raise self._fail(state, f"{prefix} carry per_step_drafted without per_step_accepted")
        if len(accepted) != len(drafted):
            raise self._fail(
                state, f"{prefix} list {len(accepted)} accepted and {len(drafted)} drafted steps"
            )
        if state.metrics is None:
            state.metrics = (list(accepted), list(drafted))
        elif state.metrics != (list(accepted), list(drafted)):
            raise self._fail(state, f"{prefix} differ between two usage chunks")

    def finish_sse(self, stream: int, finish_reason: str | None) -> None:
        """The body ended normally; `finish_reason` is choice 0's (one value, or None)."""
        self._check_stream_index(stream)
        if finish_reason is not None and not isinstance(finish_reason, str):
            raise TypeError(
                f"finish_reason must be a string or None, not {type(finish_reason).__name__}"
            )
        state = self._sse_state(stream)
        if state is None:
            return
        state.sse_finished = True
        state.sse_reason = finish_reason
        try:
            self._sse_end_rules(state)
            self._progress(state)
        except _Failed:
            pass

    def push_lost(self, frames: int | None) -> None:
        """Telemetry lost between the server and this client, not by a sender
        (docs/PROTOCOL.md, "Lost telemetry"): `frames` the server's hub discarded
        for this client (a `dropped` item), None an unknown number (the telemetry
        stream ended before the run). Like any frame loss it fails every stream without
        a final verdict, an exact one too (a lost frame may have been a notice for it);
        0 lost nothing."""
        if frames is not None and (
            isinstance(frames, bool) or not isinstance(frames, int) or not 0 <= frames <= U64_MAX
        ):
            raise ValueError(f"lost frame count {frames} out of range 0..=18446744073709551615")
        self._input_start = len(self._events)
        if frames == 0 or self._finalized:
            return
        if frames is None:
            self._frames_lost("telemetry lost: the telemetry stream ended before the run")
        else:
            self._frames_lost(f"telemetry lost: {frames} frames dropped by the server")

    def push_stream_lost(self, stream: int, reason: str) -> None:
        """A stream's in-band telemetry is missing frames (docs/PROTOCOL.md, "In-band
        telemetry"): only that stream fails (an exact one is revoked before finalize);
        its frames travel in its own response, so no other stream lost one."""
        self._check_stream_index(stream)
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a string, not {type(reason).__name__}")
        self._input_start = len(self._events)
        if self._finalized:
            return
        state = self._streams[stream]
        if state.verdict != "failed":
            self._set_failed(state, reason)

    def finalize(self) -> None:
        """Every pending stream gets its verdict; from now on every verdict is final. A
        source still holding frames behind a missing one lost a frame: that fails every
        stream, an exact one too (as a loss before finalize does)."""
        if self._finalized:
            return
        self._input_start = len(self._events)
        for source in self._sources.values():
            if source.buffered:
                self._frames_lost(
                    f"frames lost: gap in source {source.source_id:016x} at seq {source.next_seq}"
                )
                break
        for state in self._streams:
            if state.verdict == "pending":
                self._set_failed(state, self._finalize_reason(state))
        self._finalized = True

    def drain(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def stream_stats(self, stream: int) -> dict[str, object]:
        self._check_stream_index(stream)
        stats = dict(self._streams[stream].stats)
        stats["hist"] = dict(stats["hist"])
        for key in LIST_KEYS:
            stats[key] = list(stats[key])
        return stats

    def totals(self) -> dict[str, object]:
        totals = _empty_stats()
        for state in self._streams:
            for key in STAT_KEYS:
                if key == "hist":
                    for size, count in state.stats["hist"].items():
                        totals["hist"][size] = totals["hist"].get(size, 0) + count
                elif key in LIST_KEYS:
                    _add_lists(totals[key], state.stats[key])
                else:
                    totals[key] += state.stats[key]
        return totals

    def counters(self) -> dict[str, int]:
        return dict(self._counters)

    def sources(self) -> list[dict[str, object]]:
        return [dict(hello) for hello in self._hellos]

    def verdict(self, stream: int) -> tuple[str, str | None]:
        self._check_stream_index(stream)
        state = self._streams[stream]
        return state.verdict, state.reason

    # ------------------------------------------------------ frame admission

    def _check_stream_index(self, stream: int) -> None:
        if not 0 <= stream < self.num_streams:
            raise ValueError(f"stream {stream} out of range 0..{self.num_streams}")

    def _reject(self, message: str) -> None:
        self._counters["rejected_frames"] += 1
        self._events.append(("run", f"rejected frame: {message}"))

    def _admit(self, frame: Frame, data: bytes) -> None:
        source_id = frame.header.source_id
        source = self._sources.get(source_id)
        if source is None:
            source = self._sources[source_id] = _Source(source_id)
        seq = frame.header.seq
        digest = hashlib.blake2b(data, key=self._digest_key, digest_size=16).digest()
        if seq < source.next_seq or seq in source.buffered:
            self._counters["duplicate_frames"] += 1
            # A seq given up after a gap has no digest: nothing to compare it with.
            if seq in source.digests and source.digests[seq] != digest:
                self._run_failure(
                    f"source {source_id:016x}: seq {seq} received twice with different content"
                )
            return
        source.digests[seq] = digest
        source.buffered[seq] = frame
        self._release_in_order(source)
        if len(source.buffered) > REORDER_WINDOW:
            missing = source.next_seq
            self._counters["gaps"] += 1
            self._frames_lost(f"frames lost: gap in source {source_id:016x} at seq {missing}")
            source.next_seq = min(source.buffered)
            self._release_in_order(source)

    def _release_in_order(self, source: _Source) -> None:
        while source.next_seq in source.buffered:
            frame = source.buffered.pop(source.next_seq)
            source.next_seq += 1
            self._release(source, frame)

    def _release(self, source: _Source, frame: Frame) -> None:
        header = frame.header
        kind_name = KIND_NAMES[frame.kind]
        if source.broken:
            return
        if frame.kind == KIND_HELLO:
            if source.role is not None:
                # The same hello again changes nothing; another one contradicts the first.
                if frame.hello == source.hello:
                    self._reject(f"second hello from source {source.source_id:016x}")
                else:
                    self._run_failure(
                        f"source {source.source_id:016x}: a second hello that differs from "
                        "its first"
                    )
                return
            self._register_hello(source, frame)
        elif source.role is None:
            source.broken = True
            self._run_failure(f"source {source.source_id:016x}: {kind_name} frame before its hello")
            return
        elif (frame.kind == KIND_PROVENANCE and source.role != SOURCE_SCHEDULER) or (
            frame.kind == KIND_TEXT and source.role != SOURCE_FRONTEND
        ):
            role_name = ROLE_NAMES[source.role]
            self._run_failure(
                f"source {source.source_id:016x}: {kind_name} frame from a {role_name} source"
            )
            return
        self._counters["dropped_reported"] += header.dropped
        if header.dropped > 0:
            self._frames_lost(
                f"frames lost: source {source.source_id:016x} dropped {header.dropped} "
                f"frames before seq {header.seq}"
            )
        for record in frame.records:
            if isinstance(record, NoticeRecord):
                self._notice(source, record)
                continue
            if record.stream >= self.num_streams:
                self._counters["foreign_records"] += 1
                continue
            state = self._streams[record.stream]
            if state.verdict == "failed":
                continue
            try:
                if isinstance(record, ProvenanceRecord):
                    self._provenance(state, source, record, header.step)
                else:
                    self._text(state, source, record, header.step)
                self._progress(state)
            except _Failed:
                pass

    def _register_hello(self, source: _Source, frame: Frame) -> None:
        hello = frame.hello
        assert hello is not None
        source.role = hello.role
        source.hello = hello
        self._hellos.append(
            {
                "source_id": source.source_id,
                "role": ROLE_NAMES[hello.role],
                "engine": ENGINE_NAMES[hello.engine],
                "role_derivation": DERIVATION_NAMES[hello.role_derivation],
                "async_scheduling": hello.async_scheduling,
                "num_speculative_tokens": hello.num_speculative_tokens,
                "plugin_version": hello.plugin_version,
                "engine_version": hello.engine_version,
                "spec_method": hello.spec_method,
                "verification": VERIFICATION_NAMES[hello.verification],
            }
        )

    def _run_failure(self, message: str) -> None:
        """The run's telemetry contradicts itself: every stream without a final
        verdict fails, an exact one is revoked."""
        self._events.append(("run", message))
        for state in self._streams:
            if state.verdict != "failed":
                self._set_failed(state, message)

    def _frames_lost(self, reason: str) -> None:
        """Frames were lost: every stream without a final verdict fails, an exact one is
        revoked (a lost frame may have been a notice for it)."""
        for state in self._streams:
            if state.verdict != "failed":
                self._set_failed(state, reason)

    def _notice(self, source: _Source, record: NoticeRecord) -> None:
        reason = (
            f"not exact: {record.message} (notice {record.code} from source "
            f"{source.source_id:016x})"
        )
        if record.stream == ALL_STREAMS:
            for state in self._streams:
                if state.verdict != "failed":
                    self._set_failed(state, reason)
        elif record.stream >= self.num_streams:
            self._counters["foreign_records"] += 1
        elif self._streams[record.stream].verdict != "failed":
            self._set_failed(self._streams[record.stream], reason)

    # ------------------------------------------------------ per-stream rules

    def _set_failed(self, state: _Stream, reason: str) -> None:
        """Fail a pending stream, or revoke an exact one (before finalize)."""
        state.verdict = "failed"
        state.reason = reason
        self._events.append(("failed", state.index, reason))

    def _fail(self, state: _Stream, reason: str) -> _Failed:
        self._set_failed(state, reason)
        return _Failed(reason)

    def _hello_pair(self, state: _Stream) -> None:
        """The scheduler's and the frontend's hellos of a stream name the same engine,
        engine version and plugin version."""
        assert state.p_source is not None and state.t_source is not None
        sched = self._sources[state.p_source].hello
        front = self._sources[state.t_source].hello
        assert sched is not None and front is not None
        for field_name, a, b in (
            ("engine", ENGINE_NAMES[sched.engine], ENGINE_NAMES[front.engine]),
            ("engine_version", sched.engine_version, front.engine_version),
            ("plugin_version", sched.plugin_version, front.plugin_version),
        ):
            if a != b:
                raise self._fail(
                    state,
                    f"stream {state.index}: the scheduler's and the frontend's hellos disagree "
                    f"on {field_name} ('{a}' vs '{b}')",
                )

    def _provenance(
        self, state: _Stream, source: _Source, record: ProvenanceRecord, step: int
    ) -> None:
        stream = state.index
        if state.p_source is None:
            state.p_source = source.source_id
            if state.t_source is not None:
                self._hello_pair(state)
        elif state.p_source != source.source_id:
            raise self._fail(
                state, f"stream {stream}: provenance from a second source {source.source_id:016x}"
            )
        if state.p_finished is not None:
            raise self._fail(
                state,
                f"stream {stream}: provenance at offset {record.offset} after the scheduler "
                "finished the request",
            )
        if state.p_trimmed:
            raise self._fail(
                state, f"stream {stream}: provenance at offset {record.offset} after a trimmed step"
            )
        # Step identity is the engine's step number: one record per stream and step.
        if state.p_step is not None and step == state.p_step:
            raise self._fail(state, f"stream {stream}: two provenance records in step {step}")
        if state.p_step is not None and step < state.p_step:
            raise self._fail(
                state, f"stream {stream}: provenance step {step} before step {state.p_step}"
            )
        state.p_step = step
        expected = len(state.p_ids)
        if record.offset != expected:
            raise self._fail(
                state, f"provenance offset {record.offset} for stream {stream}, expected {expected}"
            )
        assert source.hello is not None
        k = source.hello.num_speculative_tokens
        if record.drafts_scheduled > k:
            raise self._fail(
                state,
                f"stream {stream}: {record.drafts_scheduled} drafts scheduled at offset "
                f"{record.offset}, the scheduler's hello says K {k}",
            )
        ordinal = len(state.p_steps)
        state.p_steps.append(
            _ProvenanceStep(
                record.offset,
                list(record.roles),
                record.drafts_scheduled,
                record.drafts_padded,
                ordinal,
                record.trimmed,
            )
        )
        for token_id, role in zip(record.token_ids, record.roles, strict=True):
            offset = len(state.p_ids)
            state.p_ids.append(token_id)
            state.p_ordinals.append(ordinal)
            state.p_roles.append(role)
            self._check_provenance_token(state, offset)
        end = len(state.p_ids)
        text_end = len(state.t_ids)
        # The step holding the stop-string text's last token (offset text_end - 1).
        if (
            state.t_finished
            and state.t_stop_string
            and not state.trim_checked
            and record.offset < text_end <= end
        ):
            self._check_trim(state, end)
        if record.finished:
            state.p_finished = record.finish_reason
        state.p_trimmed = record.trimmed
        if state.p_finished is not None or state.p_trimmed:
            self._p_closed_rules(state)
        if state.p_finished is not None or state.trim_checked:
            self._metrics_rules(state)

    def _p_closed_rules(self, state: _Stream) -> None:
        """The scheduler's last step ended: no token of the other witnesses beyond it,
        and the same finish as the detokenizer's."""
        end = len(state.p_ids)
        for witness, count in (("text", len(state.t_ids)), ("SSE", len(state.q_ids))):
            if count > end:
                raise self._fail(
                    state,
                    f"stream {state.index}: {witness} token at offset {end} after the "
                    f"scheduler's last step ended at offset {end}",
                )
        self._finish_pair(state)

    def _finish_pair(self, state: _Stream) -> None:
        """Without a stop string, the scheduler and the detokenizer finish alike."""
        p = state.p_finished
        if p is not None and state.t_finished and not state.t_stop_string and p != state.t_reason:
            raise self._fail(
                state,
                f"stream {state.index}: the scheduler finished the request with "
                f"'{_finish_name(p)}', the detokenizer with '{_finish_name(state.t_reason)}'",
            )

    @staticmethod
    def _has_metrics(state: _Stream) -> bool:
        return state.metrics is not None

    def _metrics_rules(self, state: _Stream) -> None:
        """The fourth witness: vLLM's per-request metrics list the scheduler's steps with
        drafts, in order, with their accepted (counted before a stop cut the step) and
        drafted counts. Checked in full once the lists and the scheduler's finish are
        known. After a stop-string finish they are also checked as soon as the
        scheduler's step holding the text's last token is known, up to that step: a
        contradiction there fails the stream even if the scheduler never finishes the
        request (vLLM sends the lists only with the engine's finish, so exactness
        still needs it)."""
        if state.metrics is None:
            return
        stream, (accepted, drafted) = state.index, state.metrics
        prefix = f"stream {stream}: vLLM's per-request metrics"
        steps = [step for step in state.p_steps if step.drafts_scheduled > 0]
        if state.p_finished is not None and not state.metrics_checked:
            if len(accepted) != len(steps):
                raise self._fail(
                    state,
                    f"{prefix} list {len(accepted)} verify steps, the scheduler sent "
                    f"{len(steps)} steps with drafts",
                )
            full = True
        elif (
            state.p_finished is None
            and state.t_stop_string
            and state.trim_checked
            and not state.metrics_to_stop
        ):
            # Steps that start after the text's end are surplus: not compared.
            end = len(state.t_ids)
            steps = [step for step in steps if step.offset < end]
            if len(accepted) < len(steps):
                raise self._fail(
                    state,
                    f"{prefix} list {len(accepted)} verify steps, the scheduler sent "
                    f"{len(steps)} steps with drafts up to the stop string",
                )
            full = False
        else:
            return
        shown = len(steps)
        for index, (step, a, d) in enumerate(
            zip(steps, accepted[:shown], drafted[:shown], strict=True)
        ):
            ra = step.roles.count(ROLE_ACCEPTED)
            rd = step.drafts_scheduled - step.drafts_padded
            accepted_ok = ra <= a <= rd if step.trimmed else a == ra
            if d != rd or not accepted_ok:
                raise self._fail(
                    state,
                    f"{prefix} disagree at verify step {index}: {a} accepted of {d} drafted, "
                    f"the scheduler's step at offset {step.offset} says {ra} of {rd}",
                )
        if full:
            state.metrics_checked = True
            state.stats["metrics_steps"] = shown
        else:
            state.metrics_to_stop = True

    def _check_trim(self, state: _Stream, step_end: int) -> None:
        """A stop-string finish at offset e with n trimmed tokens: the scheduler's step
        holding offset e - 1 ends at e + n (the detokenizer keeps whole steps up to
        the stop string, and trims only that step)."""
        state.trim_checked = True
        end, trimmed = len(state.t_ids), state.t_trimmed_tokens
        if step_end != end + trimmed:
            raise self._fail(
                state,
                f"stream {state.index}: the text ends at offset {end} with {trimmed} trimmed "
                f"tokens, the scheduler's step holding offset {end - 1} ends at offset "
                f"{step_end}",
            )

    def _check_provenance_token(self, state: _Stream, offset: int) -> None:
        if offset < len(state.t_ids):
            scheduler, detokenizer = state.p_ids[offset], state.t_ids[offset]
            if scheduler != detokenizer:
                raise self._fail(
                    state,
                    f"token mismatch at offset {offset}: "
                    f"scheduler {scheduler}, detokenizer {detokenizer}",
                )
        elif state.t_finished and not state.t_stop_string:
            raise self._fail(
                state,
                f"stream {state.index}: provenance beyond the end of the request "
                f"at offset {offset}",
            )

    def _text(self, state: _Stream, source: _Source, record: TextRecord, step: int) -> None:
        stream = state.index
        if state.t_source is None:
            state.t_source = source.source_id
            if state.p_source is not None:
                self._hello_pair(state)
        elif state.t_source != source.source_id:
            raise self._fail(
                state, f"stream {stream}: text from a second source {source.source_id:016x}"
            )
        if state.t_finished:
            raise self._fail(state, f"stream {stream}: text after finish")
        if state.t_step is not None and step == state.t_step:
            raise self._fail(state, f"stream {stream}: two text records in step {step}")
        if state.t_step is not None and step < state.t_step:
            raise self._fail(state, f"stream {stream}: text step {step} before step {state.t_step}")
        state.t_step = step
        expected = len(state.t_ids)
        if record.offset != expected:
            raise self._fail(
                state, f"text offset {record.offset} for stream {stream}, expected {expected}"
            )
        p_closed = state.p_finished is not None or state.p_trimmed
        for token in record.tokens:
            offset = len(state.t_ids)
            if p_closed and offset >= len(state.p_ids):
                raise self._fail(
                    state,
                    f"stream {stream}: text token at offset {offset} after the scheduler's "
                    f"last step ended at offset {len(state.p_ids)}",
                )
            state.t_ids.append(token.token_id)
            self._check_text_token(state, offset)
            if not token.fragment:
                state.pending_gives.append(token.lead_len)
                continue
            gives, reach = self._claim_gives(state, offset, token.span_back, token.lead_len)
            start = len(state.fragment_bytes)
            state.fragment_bytes += token.fragment
            state.fragments.append(
                _Fragment(
                    offset,
                    token.span_back,
                    start,
                    len(state.fragment_bytes),
                    token.lead_len,
                    gives,
                    reach,
                )
            )
        state.http_bytes += record.http_delta
        state.t_ends.append((len(state.t_ids), len(state.http_bytes)))
        if len(state.http_bytes) > len(state.fragment_bytes):
            raise self._fail(
                state,
                f"stream {stream}: HTTP text extends beyond the detokenized fragments "
                f"at byte {len(state.fragment_bytes)}",
            )
        if record.finished:
            state.t_finished = True
            state.t_reason = record.finish_reason
            state.t_truncated = record.text_truncated
            state.t_stop_string = record.text_truncated or record.tokens_trimmed
            state.t_trimmed_tokens = record.trimmed_tokens
            self._t_end_rules(state)

    def _claim_gives(
        self, state: _Stream, offset: int, span_back: int, lead: int
    ) -> tuple[list[int] | None, int]:
        """A fragment at `offset` claims its `span_back` predecessors among the pending
        empty tokens: none of the others gave bytes (no fragment will carry them), and
        the predecessors' known give counts add up to at most its lead_len, exactly
        when all are known. Returns the gives when all are known and lead_len is, and
        the fragment's reach: an unclaimed token whose give is unknown may have given
        any number of its bytes, so the fragment's characters may come from it too."""
        stream, pending = state.index, state.pending_gives
        if span_back > len(pending):
            raise self._fail(
                state,
                f"stream {stream}: span_back {span_back} at offset {offset} "
                f"exceeds {len(pending)} pending tokens",
            )
        unclaimed = len(pending) - span_back
        for index, give in enumerate(pending[:unclaimed]):
            if give != LEAD_UNKNOWN and give > 0:
                raise self._fail(
                    state,
                    f"stream {stream}: token at offset {offset - len(pending) + index} gave "
                    f"{give} bytes that no fragment carries",
                )
        unknown = next(
            (i for i, give in enumerate(pending[:unclaimed]) if give == LEAD_UNKNOWN), None
        )
        reach = offset - span_back if unknown is None else offset - len(pending) + unknown
        claimed = pending[unclaimed:]
        state.pending_gives = []
        if lead == LEAD_UNKNOWN or not claimed:
            return None, reach
        known = [give for give in claimed if give != LEAD_UNKNOWN]
        total = sum(known)
        if total > lead or (len(known) == len(claimed) and total != lead):
            raise self._fail(
                state,
                f"stream {stream}: the {span_back} tokens before offset {offset} give "
                f"{total} bytes, its lead_len says {lead}",
            )
        return (claimed if len(known) == len(claimed) else None), reach

    def _t_end_rules(self, state: _Stream) -> None:
        """The detokenizer finished the request: how it ended must agree with its own
        bytes, the scheduler and the SSE."""
        stream, end = state.index, len(state.t_ids)
        http, fragments = len(state.http_bytes), len(state.fragment_bytes)
        if state.t_reason > FINISH_LENGTH:
            raise self._fail(
                state,
                f"stream {stream}: the detokenizer finished the request with "
                f"'{_finish_name(state.t_reason)}'",
            )
        # text_truncated means the final HTTP text is shorter than the fragments.
        if state.t_truncated and http >= fragments:
            raise self._fail(
                state,
                f"stream {stream}: text_truncated, but the HTTP text is not shorter than the "
                f"fragments ({http} of {fragments} bytes)",
            )
        if not state.t_truncated and http < fragments:
            raise self._fail(
                state,
                f"stream {stream}: the HTTP text is shorter than the fragments "
                f"({http} of {fragments} bytes) without text_truncated",
            )
        if len(state.p_ids) > end and not state.t_stop_string:
            raise self._fail(
                state, f"stream {stream}: provenance beyond the end of the request at offset {end}"
            )
        if state.t_stop_string:
            if end == 0:
                raise self._fail(state, f"stream {stream}: a stop-string finish without any token")
            if len(state.p_ids) >= end:
                holding = next(
                    s for s in state.p_steps if s.offset < end <= s.offset + len(s.roles)
                )
                self._check_trim(state, holding.offset + len(holding.roles))
                self._metrics_rules(state)
        self._finish_pair(state)
        self._check_sse_within_http(state)
        if len(state.q_ids) > end:
            raise self._fail(
                state,
                f"stream {stream}: SSE token at offset {end} after the detokenizer finished "
                f"at offset {end}",
            )
        if state.sse_finished:
            self._sse_reason_rule(state)

    def _sse_reason_rule(self, state: _Stream) -> None:
        """The SSE's finish_reason is the detokenizer's."""
        expected = _finish_name(state.t_reason)
        if state.sse_reason != expected:
            raise self._fail(
                state,
                f"stream {state.index}: SSE finish_reason {shown_reason(state.sse_reason)}, "
                f"the detokenizer finished with '{expected}'",
            )

    def _sse_end_rules(self, state: _Stream) -> None:
        """The SSE body ended: it carried the stream's chunk id and the detokenizer's
        finish reason."""
        stream = state.index
        if state.sse_id is None:
            raise self._fail(state, f"stream {stream}: no SSE chunk id")
        if state.t_finished:
            self._sse_reason_rule(state)

    def _check_text_token(self, state: _Stream, offset: int) -> None:
        detokenizer = state.t_ids[offset]
        if offset < len(state.p_ids) and state.p_ids[offset] != detokenizer:
            raise self._fail(
                state,
                f"token mismatch at offset {offset}: "
                f"scheduler {state.p_ids[offset]}, detokenizer {detokenizer}",
            )
        if offset < len(state.q_ids) and state.q_ids[offset] != detokenizer:
            raise self._fail(
                state,
                f"token mismatch at offset {offset}: "
                f"detokenizer {detokenizer}, SSE {state.q_ids[offset]}",
            )

    def _check_sse_within_http(self, state: _Stream) -> None:
        if state.t_finished and len(state.sse_bytes) > len(state.http_bytes):
            raise self._fail(
                state,
                f"stream {state.index}: SSE text extends beyond the HTTP text "
                f"at byte {len(state.http_bytes)}",
            )

    def _progress(self, state: _Stream) -> None:
        """After any new evidence: settle records, prove fragments, maybe declare exact."""
        self._settle(state)
        if state.verdict != "pending":
            return  # an exact stream: only late surplus records settle
        self._prove(state)
        self._chunk_rule(state)
        if self._is_exact(state):
            state.verdict = "exact"
            self._events.append(("exact", state.index))

    def _settle(self, state: _Stream) -> None:
        confirmed_end = state.confirmed_end
        surplus_from = state.surplus_from
        while state.settled_steps < len(state.p_steps):
            step = state.p_steps[state.settled_steps]
            end = step.offset + len(step.roles)
            boundary = end if surplus_from is None else min(end, surplus_from)
            if confirmed_end < boundary:
                return  # some token is neither confirmed nor surplus yet
            stats = state.stats
            confirmed = 0
            for position, role in enumerate(step.roles):
                name = TOKEN_ROLE_NAMES[role]
                if step.offset + position < confirmed_end:
                    confirmed += 1
                    stats[name] += 1
                else:
                    stats["surplus_tokens"] += 1
                    stats[f"surplus_{name}"] += 1
            stats["tokens"] += confirmed
            if confirmed:
                stats["steps"] += 1
            stats["hist"][confirmed] = stats["hist"].get(confirmed, 0) + 1
            stats["drafts_scheduled"] += step.drafts_scheduled
            stats["drafts_padded"] += step.drafts_padded
            drafts = step.drafts_scheduled - step.drafts_padded
            accepted = sum(
                1
                for position, role in enumerate(step.roles)
                if role == ROLE_ACCEPTED and step.offset + position < confirmed_end
            )
            _add_lists(stats["drafts_by_pos"], [1] * drafts)
            _add_lists(stats["accepted_by_pos"], [1] * accepted + [0] * (drafts - accepted))
            state.settled_steps += 1

    def _prove(self, state: _Stream) -> None:
        confirmed_end = state.confirmed_end
        http, sse, fragment_bytes = state.http_bytes, state.sse_bytes, state.fragment_bytes
        http_final = state.t_finished and state.t_truncated  # H ends inside the fragments
        while state.proven_fragments < len(state.fragments):
            fragment = state.fragments[state.proven_fragments]
            if confirmed_end <= fragment.offset:
                return  # its tokens (the carrier and its span_back predecessors) not confirmed
            if http_final and fragment.start >= len(http):
                state.proven_fragments += 1  # cut by the stop string: not output
                continue
            end = min(fragment.end, len(http)) if http_final else fragment.end
            if len(http) < end or len(sse) < end:
                return
            for position in range(fragment.start, end):
                if fragment_bytes[position] != http[position]:
                    raise self._fail(
                        state,
                        f"byte mismatch at offset {fragment.offset} (byte {position}): "
                        "detokenizer fragment vs HTTP delta",
                    )
            for position in range(fragment.start, end):
                if http[position] != sse[position]:
                    raise self._fail(
                        state,
                        f"byte mismatch at offset {fragment.offset} (byte {position}): "
                        "HTTP delta vs SSE",
                    )
            state.proven_fragments += 1
            state.proven_bytes = end
            for piece in self._pieces(state, fragment, end - fragment.start):
                self._emit_span(state, fragment.start, piece)

    def _chunk_rule(self, state: _Stream) -> None:
        """Each SSE chunk carries whole steps: it ends where a text record ends (several
        records when the HTTP writer merged steps). A chunk is held against the first
        text record that ends at or after it once that record's tokens are confirmed and
        its bytes proven, so a token or byte mismatch inside it is reported first."""
        confirmed_end = state.confirmed_end
        while state.q_ends:
            q, b = state.q_ends[0]
            while state.t_ends and state.t_ends[0] < (q, b):
                state.t_ends.popleft()
            if not state.t_ends:
                return
            t, h = state.t_ends[0]
            if t > confirmed_end or h > state.proven_bytes:
                return
            if (t, h) != (q, b):
                raise self._fail(
                    state,
                    f"stream {state.index}: an SSE chunk ends at offset {q} (byte {b}), "
                    "inside a text record",
                )
            state.t_ends.popleft()
            state.q_ends.popleft()

    @staticmethod
    def _shared(values: list[int]) -> int | None:
        """The value every element has, else None."""
        return values[0] if values and len(set(values)) == 1 else None

    def _pieces(self, state: _Stream, fragment: _Fragment, available: int) -> list[_Piece]:
        """A proven fragment's characters in runs attributed alike ("Spans"). The
        fragment's bytes are owned by units (token ranges): with every give count
        known, each predecessor its gives and the carrier the rest; with only
        lead_len known, the predecessors together the first lead_len bytes and the
        carrier the rest; else all its tokens the whole fragment. A character's
        tokens are those of the units overlapping it, first to last. Only the first
        `available` bytes are output. Every character's tokens start at the
        fragment's reach (an unclaimed token of unknown give may have given any of
        them)."""
        carrier, first = fragment.offset, fragment.offset - fragment.span_back
        size = fragment.end - fragment.start
        # (first token, token count, byte start, byte end) per unit, in order.
        units: list[tuple[int, int, int, int]]
        if fragment.span_back == 0 or fragment.lead_len == LEAD_UNKNOWN:
            units = [(first, fragment.span_back + 1, 0, size)]
        elif fragment.gives is not None:
            units, at = [], 0
            for index, give in enumerate(fragment.gives):
                units.append((first + index, 1, at, at + give))
                at += give
            units.append((carrier, 1, at, size))
        else:
            lead = fragment.lead_len
            units = [(first, fragment.span_back, 0, lead), (carrier, 1, lead, size)]
        data = state.fragment_bytes[fragment.start : fragment.end]
        pieces: list[_Piece] = []
        position = 0
        while position < available:
            end = position + 1  # the end of this character
            while end < size and data[end] & 0xC0 == 0x80:
                end += 1
            # A unit overlaps [position, end) (an empty unit: lies strictly inside it).
            owners = [u for u in units if u[2] < end and u[3] > position]
            low = fragment.reach if fragment.reach < first else owners[0][0]
            high = owners[-1][0] + owners[-1][1]
            end = min(end, available)
            last = pieces[-1] if pieces else None
            if last is not None and (last.first, last.count) == (low, high - low):
                last.end = end
            else:
                group = range(low, high)
                step = self._shared([state.p_ordinals[o] for o in group])
                role = self._shared([state.p_roles[o] for o in group])
                pieces.append(_Piece(position, end, step, role, low, high - low))
            position = end
        return pieces

    def _emit_span(self, state: _Stream, fragment_start: int, piece: _Piece) -> None:
        start = fragment_start + piece.start
        text = bytes(state.fragment_bytes[start : fragment_start + piece.end]).decode("utf-8")
        state.stats["bytes"] += piece.end - piece.start
        if piece.step is None:
            state.stats["mixed_spans"] += 1
        previous = self._events[-1] if len(self._events) > self._input_start else None
        if (
            piece.step is not None
            and previous is not None
            and previous[0] == "span"
            and previous[1] == state.index
            and previous[4] == piece.step
            and previous[7] == piece.role
            and previous[2] + len(previous[3].encode("utf-8")) == start
        ):
            # The same step and role, contiguous, proven by the same input: one span.
            merged_first = previous[5]
            self._events[-1] = (
                "span",
                state.index,
                previous[2],
                previous[3] + text,
                piece.step,
                merged_first,
                piece.first + piece.count - merged_first,
                piece.role,
            )
            return
        self._events.append(
            ("span", state.index, start, text, piece.step, piece.first, piece.count, piece.role)
        )

    def _is_exact(self, state: _Stream) -> bool:
        text_end = len(state.t_ids)
        # Not vacuously, and with the request's end proven: the scheduler's finish, or
        # a stop string's trimmed tokens checked against the scheduler's step.
        end_proven = state.trim_checked if state.t_stop_string else state.p_finished is not None
        metrics_proven = state.metrics_checked or not self._has_metrics(state)
        return (
            state.sse_finished
            and state.t_finished
            and text_end > 0
            and end_proven
            and metrics_proven
            and len(state.q_ids) == text_end
            and len(state.p_ids) >= text_end
            and len(state.sse_bytes) == len(state.http_bytes)
            and state.proven_bytes >= len(state.sse_bytes)
            and not state.q_ends
            and state.settled_steps == len(state.p_steps)
        )

    # ------------------------------------------------------------ finalize

    def _finalize_reason(self, state: _Stream) -> str:
        stream = state.index
        if not self._admitted_any:
            return "missing telemetry: no frames received for this run"
        if not state.sse_finished:
            return f"stream {stream}: SSE did not finish"
        p_end, t_end, q_end = len(state.p_ids), len(state.t_ids), len(state.q_ids)
        if max(q_end, t_end) > p_end:
            return f"missing telemetry: no provenance for offset {p_end}"
        if q_end > t_end:
            return f"missing telemetry: no text frame for offset {t_end}"
        if not state.t_finished:
            return f"missing telemetry: text not finished at offset {t_end}"
        if (not state.t_stop_string or self._has_metrics(state)) and state.p_finished is None:
            return f"missing telemetry: the scheduler did not finish the request at offset {p_end}"
        sse_len, http_len = len(state.sse_bytes), len(state.http_bytes)
        if sse_len < http_len:
            return (
                f"stream {stream}: SSE text shorter than the HTTP text "
                f"({sse_len} of {http_len} bytes)"
            )
        if q_end != t_end:
            return f"stream {stream}: {q_end} SSE tokens, {t_end} detokenized tokens"
        return f"stream {stream}: unproven bytes from byte {state.proven_bytes}"
