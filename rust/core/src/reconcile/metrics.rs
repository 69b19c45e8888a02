//! The fourth witness: vLLM's per-request speculative-decoding metrics against
//! the scheduler's records (docs/PROTOCOL.md "The fourth witness").

use super::*;

impl Stream {
    /// vLLM's per-request metrics (`per_step_accepted` / `per_step_drafted`)
    /// are present.
    pub(super) fn has_metrics(&self) -> bool {
        self.usage
            .as_ref()
            .is_some_and(|u| u.per_step_accepted.is_some() || u.per_step_drafted.is_some())
    }

    /// The fourth witness: vLLM's per-request metrics list the scheduler's
    /// steps with drafts, in order, with their accepted and drafted counts
    /// (accepted counted before a stop cut the step). Checked once both the
    /// lists and the scheduler's finish are known.
    pub(super) fn metrics_rules(&mut self, s: usize) -> Result<(), String> {
        let Some(usage) = &self.usage else {
            return Ok(());
        };
        let (accepted, drafted) = match (&usage.per_step_accepted, &usage.per_step_drafted) {
            (None, None) => return Ok(()),
            (Some(_), None) => {
                return Err(format!(
                    "stream {s}: vLLM's per-request metrics carry per_step_accepted without per_step_drafted"
                ))
            }
            (None, Some(_)) => {
                return Err(format!(
                    "stream {s}: vLLM's per-request metrics carry per_step_drafted without per_step_accepted"
                ))
            }
            (Some(a), Some(d)) => (a, d),
        };
        if accepted.len() != drafted.len() {
            return Err(format!(
                "stream {s}: vLLM's per-request metrics list {} accepted and {} drafted steps",
                accepted.len(),
                drafted.len()
            ));
        }
        if self.p_finished.is_none() || self.metrics_checked {
            return Ok(());
        }
        if accepted.len() != self.spec_steps.len() {
            return Err(format!(
                "stream {s}: vLLM's per-request metrics list {} verify steps, the scheduler sent {} steps with drafts",
                accepted.len(),
                self.spec_steps.len()
            ));
        }
        for (i, (step, (&a, &d))) in self
            .spec_steps
            .iter()
            .zip(accepted.iter().zip(drafted))
            .enumerate()
        {
            let (ra, rd) = (u32::from(step.accepted), u32::from(step.drafted));
            let accepted_ok = if step.trimmed {
                ra <= a && a <= rd
            } else {
                a == ra
            };
            if d != rd || !accepted_ok {
                return Err(format!(
                    "stream {s}: vLLM's per-request metrics disagree at verify step {i}: \
                     {a} accepted of {d} drafted, the scheduler's step at offset {} says {ra} of {rd}",
                    step.offset
                ));
            }
        }
        self.metrics_checked = true;
        self.stats.metrics_steps = accepted.len() as u64;
        Ok(())
    }
}
