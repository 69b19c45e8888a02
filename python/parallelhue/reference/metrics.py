"""vLLM's per-request metrics, the fourth witness (the Rust core's `reconcile/metrics.rs`)."""

from __future__ import annotations

from parallelhue.reference.prove import ProveRules
from parallelhue.reference.state import _Stream
from parallelhue_vllm.wire import ROLE_ACCEPTED


class MetricsRules(ProveRules):
    """Holds the per-request metrics against the provenance records."""

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

    def _metrics_rules(self, state: _Stream) -> None:
        """The fourth witness: vLLM's per-request metrics list the scheduler's steps with
        drafts, in order, with their accepted (counted before a stop cut the step) and
        drafted counts. Checked once both the lists and the scheduler's finish are known."""
        if state.metrics is None:
            return
        stream, (accepted, drafted) = state.index, state.metrics
        prefix = f"stream {stream}: vLLM's per-request metrics"
        if state.p_finished is None or state.metrics_checked:
            return
        steps = [step for step in state.p_steps if step.drafts_scheduled > 0]
        if len(accepted) != len(steps):
            raise self._fail(
                state,
                f"{prefix} list {len(accepted)} verify steps, the scheduler sent {len(steps)} "
                "steps with drafts",
            )
        for index, (step, a, d) in enumerate(zip(steps, accepted, drafted, strict=True)):
            ra = step.roles.count(ROLE_ACCEPTED)
            rd = step.drafts_scheduled - step.drafts_padded
            accepted_ok = ra <= a <= rd if step.trimmed else a == ra
            if d != rd or not accepted_ok:
                raise self._fail(
                    state,
                    f"{prefix} disagree at verify step {index}: {a} accepted of {d} drafted, "
                    f"the scheduler's step at offset {step.offset} says {ra} of {rd}",
                )
        state.metrics_checked = True
        state.stats["metrics_steps"] = len(accepted)
