//! The fourth witness: vLLM's per-request speculative-decoding metrics against
//! the scheduler's records (docs/PROTOCOL.md "The fourth witness").

use super::*;

impl Stream {
    /// vLLM's per-request metrics (`per_step_accepted` / `per_step_drafted`)
    /// were received.
    pub(super) fn has_metrics(&self) -> bool {
        self.metrics.is_some()
    }

    /// One usage statement, checked as it arrives and kept (evidence is
    /// monotone): `completion_tokens` counts the SSE tokens so far; the
    /// per-step lists come as a pair, and once received they never change
    /// (a usage chunk without them says nothing about them).
    pub(super) fn usage_rules(
        &mut self,
        s: usize,
        completion_tokens: Option<u64>,
        accepted: Option<&[u32]>,
        drafted: Option<&[u32]>,
    ) -> Result<(), String> {
        if let Some(n) = completion_tokens {
            if n != self.q_end {
                return Err(format!(
                    "stream {s}: usage.completion_tokens {n}, but the SSE carried {} tokens",
                    self.q_end
                ));
            }
        }
        let (accepted, drafted) = match (accepted, drafted) {
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
        match &self.metrics {
            None => {
                self.metrics = Some(Metrics {
                    accepted: accepted.to_vec(),
                    drafted: drafted.to_vec(),
                })
            }
            Some(m) if m.accepted != accepted || m.drafted != drafted => {
                return Err(format!(
                    "stream {s}: vLLM's per-request metrics differ between two usage chunks"
                ))
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// The fourth witness: vLLM's per-request metrics list the scheduler's
    /// steps with drafts, in order, with their accepted and drafted counts
    /// (accepted counted before a stop cut the step). Checked in full once
    /// the lists and the scheduler's finish are known. After a stop-string
    /// finish they are also checked as soon as the scheduler's step holding
    /// the text's last token is known, up to that step: a contradiction there
    /// fails the stream even if the scheduler never finishes the request
    /// (vLLM sends the lists only with the engine's finish, so exactness
    /// still needs it).
    pub(super) fn metrics_rules(&mut self, s: usize) -> Result<(), String> {
        let Some(Metrics { accepted, drafted }) = &self.metrics else {
            return Ok(());
        };
        let (steps, full) = if self.p_finished.is_some() && !self.metrics_checked {
            if accepted.len() != self.spec_steps.len() {
                return Err(format!(
                    "stream {s}: vLLM's per-request metrics list {} verify steps, the scheduler sent {} steps with drafts",
                    accepted.len(),
                    self.spec_steps.len()
                ));
            }
            (self.spec_steps.len(), true)
        } else if self.p_finished.is_none()
            && self.t_stop_string
            && self.trim_checked
            && !self.metrics_to_stop
        {
            // Steps that start after the text's end are surplus: not compared.
            let e = self.t_end;
            let shown = self.spec_steps.iter().take_while(|x| x.offset < e).count();
            if accepted.len() < shown {
                return Err(format!(
                    "stream {s}: vLLM's per-request metrics list {} verify steps, the scheduler sent {shown} steps with drafts up to the stop string",
                    accepted.len()
                ));
            }
            (shown, false)
        } else {
            return Ok(());
        };
        for (i, (step, (&a, &d))) in self
            .spec_steps
            .iter()
            .zip(accepted.iter().zip(drafted))
            .take(steps)
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
        if full {
            self.metrics_checked = true;
            self.stats.metrics_steps = steps as u64;
        } else {
            self.metrics_to_stop = true;
        }
        Ok(())
    }
}
