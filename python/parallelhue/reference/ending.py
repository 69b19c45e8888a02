"""How a request ends: finish reasons, trims, truncation (the Rust core's
`reconcile/ending.rs`).
"""

from __future__ import annotations

from parallelhue.reference.metrics import MetricsRules
from parallelhue.reference.sse import shown_reason
from parallelhue.reference.state import _finish_name, _Stream
from parallelhue_vllm.wire import FINISH_LENGTH


class EndingRules(MetricsRules):
    """The rules about how each witness says a request ended."""

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

    def _check_sse_within_http(self, state: _Stream) -> None:
        if state.t_finished and len(state.sse_bytes) > len(state.http_bytes):
            raise self._fail(
                state,
                f"stream {state.index}: SSE text extends beyond the HTTP text "
                f"at byte {len(state.http_bytes)}",
            )
