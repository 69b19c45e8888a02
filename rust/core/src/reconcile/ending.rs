//! How a request ends: the scheduler's finish, the detokenizer's finish and
//! stop strings, and the SSE's end, held against each other.

use super::*;
use crate::sse::shown_reason;

impl Stream {
    /// The scheduler's last step ended at `p_end`: no token of the other
    /// witnesses beyond it, and the same finish as the detokenizer's.
    pub(super) fn p_closed_rules(&self, s: usize) -> Result<(), String> {
        let e = self.p_end;
        if self.t_end > e {
            return Err(format!(
                "stream {s}: text token at offset {e} after the scheduler's last step ended at offset {e}"
            ));
        }
        if self.q_end > e {
            return Err(format!(
                "stream {s}: SSE token at offset {e} after the scheduler's last step ended at offset {e}"
            ));
        }
        self.finish_pair(s)
    }

    /// Without a stop string, the scheduler and the detokenizer finish the
    /// request alike.
    pub(super) fn finish_pair(&self, s: usize) -> Result<(), String> {
        if let Some(p) = self.p_finished {
            if self.t_finished && !self.t_stop_string && p != self.t_reason {
                return Err(format!(
                    "stream {s}: the scheduler finished the request with '{}', the detokenizer with '{}'",
                    finish_name(p),
                    finish_name(self.t_reason)
                ));
            }
        }
        Ok(())
    }

    /// A stop-string finish at offset e with n trimmed tokens: the
    /// scheduler's step holding offset e − 1 ends at e + n (the detokenizer
    /// keeps whole steps up to the stop string, and trims only that step).
    pub(super) fn check_trim(&mut self, s: usize, step_end: u64) -> Result<(), String> {
        self.trim_checked = true;
        let e = self.t_end;
        let n = u64::from(self.t_trimmed_tokens);
        if step_end != e + n {
            return Err(format!(
                "stream {s}: the text ends at offset {e} with {n} trimmed tokens, \
                 the scheduler's step holding offset {} ends at offset {step_end}",
                e - 1
            ));
        }
        Ok(())
    }

    /// The detokenizer finished the request: how it ended must agree with
    /// its own bytes, the scheduler and the SSE.
    pub(super) fn t_end_rules(&mut self, s: usize) -> Result<(), String> {
        let (e, h, f) = (self.t_end, self.h.len(), self.f.len());
        if self.t_reason > 2 {
            return Err(format!(
                "stream {s}: the detokenizer finished the request with '{}'",
                finish_name(self.t_reason)
            ));
        }
        // text_truncated means the final HTTP text is shorter than the fragments.
        if self.t_truncated && h >= f {
            return Err(format!(
                "stream {s}: text_truncated, but the HTTP text is not shorter than the fragments ({h} of {f} bytes)"
            ));
        }
        if !self.t_truncated && h < f {
            return Err(format!(
                "stream {s}: the HTTP text is shorter than the fragments ({h} of {f} bytes) without text_truncated"
            ));
        }
        if !self.t_stop_string && self.p_end > e {
            return Err(format!(
                "stream {s}: provenance beyond the end of the request at offset {e}"
            ));
        }
        if self.t_stop_string {
            if e == 0 {
                return Err(format!(
                    "stream {s}: a stop-string finish without any token"
                ));
            }
            // The scheduler's step holding offset e − 1, if it is known.
            if self.p_end >= e {
                let step_end = match self.recs.iter().find(|r| r.start < e && e <= r.end) {
                    Some(r) => r.end,
                    // Settled already: it was all confirmed, so it ended at e.
                    None => e,
                };
                self.check_trim(s, step_end)?;
                self.metrics_rules(s)?;
            }
        }
        self.finish_pair(s)?;
        if self.s.len() > h {
            return Err(format!(
                "stream {s}: SSE text extends beyond the HTTP text at byte {h}"
            ));
        }
        if self.q_end > e {
            return Err(format!(
                "stream {s}: SSE token at offset {e} after the detokenizer finished at offset {e}"
            ));
        }
        if self.sse_finished {
            self.sse_reason_rule(s)?;
        }
        Ok(())
    }

    /// The SSE's finish_reason is the detokenizer's.
    pub(super) fn sse_reason_rule(&self, s: usize) -> Result<(), String> {
        let t = finish_name(self.t_reason);
        if self.sse_reason.as_deref() != Some(t) {
            return Err(format!(
                "stream {s}: SSE finish_reason {}, the detokenizer finished with '{t}'",
                shown_reason(self.sse_reason.as_deref())
            ));
        }
        Ok(())
    }

    /// The SSE body ended: it must have carried the stream's chunk id and
    /// the detokenizer's finish reason.
    pub(super) fn sse_end_rules(&self, s: usize) -> Result<(), String> {
        if self.sse_id.is_none() {
            return Err(format!("stream {s}: no SSE chunk id"));
        }
        if self.t_finished {
            self.sse_reason_rule(s)?;
        }
        Ok(())
    }
}
