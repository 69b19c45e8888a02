"""One stream's join of provenance and text records by token offset (the Rust core's
`reconcile/stream.rs`).
"""

from __future__ import annotations

from parallelhue.reference.ending import EndingRules
from parallelhue.reference.state import ENGINE_NAMES, _Fragment, _ProvenanceStep, _Source, _Stream
from parallelhue_vllm.wire import LEAD_UNKNOWN, ProvenanceRecord, TextRecord


class StreamRules(EndingRules):
    """Joins a stream's provenance and text records by absolute token offset."""

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
