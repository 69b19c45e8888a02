//! `finalize()`: the verdict of every stream still open, and finality.

use super::*;

impl Reconciler {
    /// The client gives up waiting: every open stream gets its verdict, and
    /// every verdict is final. A source still holding frames behind a missing
    /// one lost a frame: that fails every stream, an exact one too (as a loss
    /// before finalize does: the lost frame may have been a notice for it).
    pub fn finalize(&mut self) {
        if self.finalized {
            return;
        }
        self.begin_input();
        let gap = self.sources.iter().find_map(|(id, src)| {
            (src.seq.buffered_len() > 0).then(|| (id, src.seq.next_expected()))
        });
        if let Some((id, seq)) = gap {
            self.frames_lost(&format!(
                "frames lost: gap in source {id:016x} at seq {seq}"
            ));
        }
        for s in 0..self.streams.len() {
            if !self.streams[s].open() {
                continue;
            }
            let reason = self.final_reason(s);
            self.fail(s, reason);
        }
        self.finalized = true;
    }

    pub(super) fn final_reason(&self, s: usize) -> String {
        let st = &self.streams[s];
        if !self.admitted {
            return "missing telemetry: no frames received for this run".to_owned();
        }
        if !st.sse_finished {
            return format!("stream {s}: SSE did not finish");
        }
        if st.q_end.max(st.t_end) > st.p_end {
            return format!("missing telemetry: no provenance for offset {}", st.p_end);
        }
        if st.q_end > st.t_end {
            return format!("missing telemetry: no text frame for offset {}", st.t_end);
        }
        if !st.t_finished {
            return format!(
                "missing telemetry: text not finished at offset {}",
                st.t_end
            );
        }
        if (!st.t_stop_string || st.has_metrics()) && st.p_finished.is_none() {
            return format!(
                "missing telemetry: the scheduler did not finish the request at offset {}",
                st.p_end
            );
        }
        if st.s.len() < st.h.len() {
            return format!(
                "stream {s}: SSE text shorter than the HTTP text ({} of {} bytes)",
                st.s.len(),
                st.h.len()
            );
        }
        if st.q_end != st.t_end {
            return format!(
                "stream {s}: {} SSE tokens, {} detokenized tokens",
                st.q_end, st.t_end
            );
        }
        format!("stream {s}: unproven bytes from byte {}", st.proven)
    }
}
