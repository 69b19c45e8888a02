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

from typing import Any

from parallelhue.reference.admission import AdmissionRules
from parallelhue.reference.decode import FrameError, decode_frame
from parallelhue.reference.state import (
    COUNTER_KEYS,
    INPUT_SHAPES,
    LATE_MESSAGE,
    LIST_KEYS,
    PD_ROUTER_NOTE,
    STAT_KEYS,
    U32_MAX,
    U64_MAX,
    Event,
    _add_lists,
    _carries_request_id,
    _check_u32_list,
    _empty_stats,
    _Failed,
    _is_pd_router_id,
    _Stream,
)

# The key lists stay importable from here (one object with parallelhue.model.shapes').
__all__ = ["COUNTER_KEYS", "STAT_KEYS", "Reconciler"]


class Reconciler(AdmissionRules):
    """Joins scheduler provenance, detokenizer text and the client's SSE stream per stream."""

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
            whose = PD_ROUTER_NOTE if _is_pd_router_id(chunk_id) else ""
            self._set_failed(
                state,
                f"stream {stream}: SSE chunk id does not carry the request id {request_id}{whose}",
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
