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
