//! One stream's join of the three witnesses by token offset: each provenance,
//! text and SSE record checked as it arrives (docs/PROTOCOL.md "Per stream").

use super::*;

impl Stream {
    pub(super) fn add_provenance(
        &mut self,
        s: usize,
        src: u64,
        step: u64,
        k: u16,
        pair: Option<String>,
        r: &ProvRecord<'_>,
    ) -> Result<(), String> {
        let offset = self.admit_provenance(s, src, step, k, pair, r)?;
        // The step ordinal is the index of the record within the stream.
        let ord = self.ord;
        self.ord += 1;
        let end = offset + r.len() as u64;
        self.record_provenance(s, offset, end, ord, r)?;
        if r.drafts_scheduled > 0 {
            self.spec_steps.push(SpecStep {
                offset,
                drafted: r.drafts_scheduled - r.drafts_padded,
                accepted: r.roles.iter().filter(|&&x| x == ROLE_ACCEPTED).count() as u16,
                trimmed: r.flags & FLAG_TRIMMED != 0,
            });
        }
        // The step holding the stop-string text's last token (offset t_end − 1).
        let t_end = self.t_end;
        if self.t_finished
            && self.t_stop_string
            && !self.trim_checked
            && offset < t_end
            && t_end <= end
        {
            self.check_trim(s, end)?;
        }
        if r.flags & FLAG_FINISHED != 0 {
            self.p_finished = Some(r.finish_reason);
        }
        self.p_trimmed = r.flags & FLAG_TRIMMED != 0;
        if self.p_finished.is_some() || self.p_trimmed {
            self.p_closed_rules(s)?;
        }
        if self.p_finished.is_some() || self.trim_checked {
            self.metrics_rules(s)?;
        }
        Ok(())
    }

    /// The rules a provenance record must pass before it is recorded: one
    /// source, its frontend pair, none after the finish or a trimmed step,
    /// one record per step in step order, contiguous offsets, at most K
    /// drafts. Its offset when it passes.
    #[inline(always)]
    fn admit_provenance(
        &mut self,
        s: usize,
        src: u64,
        step: u64,
        k: u16,
        pair: Option<String>,
        r: &ProvRecord<'_>,
    ) -> Result<u64, String> {
        match self.p_src {
            None => self.p_src = Some(src),
            Some(x) if x != src => {
                return Err(format!(
                    "stream {s}: provenance from a second source {src:016x}"
                ))
            }
            Some(_) => {}
        }
        if let Some(reason) = pair {
            return Err(reason);
        }
        let offset = u64::from(r.offset);
        if self.p_finished.is_some() {
            return Err(format!(
                "stream {s}: provenance at offset {offset} after the scheduler finished the request"
            ));
        }
        if self.p_trimmed {
            return Err(format!(
                "stream {s}: provenance at offset {offset} after a trimmed step"
            ));
        }
        // Step identity is the engine's step number: one record per stream and step.
        match self.p_step {
            Some(prev) if step == prev => {
                return Err(format!("stream {s}: two provenance records in step {step}"))
            }
            Some(prev) if step < prev => {
                return Err(format!(
                    "stream {s}: provenance step {step} before step {prev}"
                ))
            }
            _ => self.p_step = Some(step),
        }
        if offset != self.p_end {
            return Err(format!(
                "provenance offset {offset} for stream {s}, expected {}",
                self.p_end
            ));
        }
        if r.drafts_scheduled > k {
            return Err(format!(
                "stream {s}: {} drafts scheduled at offset {offset}, the scheduler's hello says K {k}",
                r.drafts_scheduled
            ));
        }
        Ok(offset)
    }

    /// Record the tokens of an admitted provenance record (ids, roles, its
    /// ordinal) against the text's, and queue it for settling; late
    /// provenance of an exact stream is only counted.
    #[inline(always)]
    fn record_provenance(
        &mut self,
        s: usize,
        offset: u64,
        end: u64,
        ord: u32,
        r: &ProvRecord<'_>,
    ) -> Result<(), String> {
        let beyond_fails = self.t_finished && !self.t_stop_string;
        let t_end = self.t_end;
        if self.exact {
            // Late provenance of an exact stream: only surplus may follow.
            if beyond_fails {
                return Err(format!(
                    "stream {s}: provenance beyond the end of the request at offset {offset}"
                ));
            }
            self.p_end = end;
            self.stats.settle(
                r.roles.iter().copied(),
                0,
                r.drafts_scheduled,
                r.drafts_padded,
            );
        } else {
            let mut counts = [0u16; 4];
            for (i, (id, &role)) in r.token_ids().zip(r.roles).enumerate() {
                let o = offset + i as u64;
                if beyond_fails && o >= t_end {
                    return Err(format!(
                        "stream {s}: provenance beyond the end of the request at offset {o}"
                    ));
                }
                let slot = self.slot(o);
                slot.p = id;
                slot.role = role;
                slot.ord = ord;
                slot.has |= HAS_P;
                if let Some(c) = counts.get_mut(usize::from(role)) {
                    *c += 1;
                }
                if slot.has & HAS_T != 0 && slot.t != id {
                    return Err(format!(
                        "token mismatch at offset {o}: scheduler {id}, detokenizer {}",
                        slot.t
                    ));
                }
                self.p_end = o + 1;
            }
            self.recs.push_back(PRec {
                start: offset,
                end,
                ds: r.drafts_scheduled,
                dp: r.drafts_padded,
                counts,
            });
        }
        Ok(())
    }

    pub(super) fn add_text(
        &mut self,
        s: usize,
        src: u64,
        step: u64,
        pair: Option<String>,
        r: &TextRecord<'_>,
    ) -> Result<(), String> {
        match self.t_src {
            None => self.t_src = Some(src),
            Some(x) if x != src => {
                return Err(format!("stream {s}: text from a second source {src:016x}"))
            }
            Some(_) => {}
        }
        if let Some(reason) = pair {
            return Err(reason);
        }
        if self.t_finished {
            return Err(format!("stream {s}: text after finish"));
        }
        match self.t_step {
            Some(prev) if step == prev => {
                return Err(format!("stream {s}: two text records in step {step}"))
            }
            Some(prev) if step < prev => {
                return Err(format!("stream {s}: text step {step} before step {prev}"))
            }
            _ => self.t_step = Some(step),
        }
        let offset = u64::from(r.offset);
        if offset != self.t_end {
            return Err(format!(
                "text offset {offset} for stream {s}, expected {}",
                self.t_end
            ));
        }
        let p_closed = self.p_finished.is_some() || self.p_trimmed;
        let mut byte = self.f.len();
        for (i, t) in r.tokens().enumerate() {
            let o = offset + i as u64;
            if p_closed && o >= self.p_end {
                return Err(format!(
                    "stream {s}: text token at offset {o} after the scheduler's last step ended at offset {}",
                    self.p_end
                ));
            }
            let id = t.token_id;
            let slot = self.slot(o);
            slot.t = id;
            slot.has |= HAS_T;
            if slot.has & HAS_P != 0 && slot.p != id {
                return Err(format!(
                    "token mismatch at offset {o}: scheduler {}, detokenizer {id}",
                    slot.p
                ));
            }
            if slot.has & HAS_Q != 0 && slot.q != id {
                return Err(format!(
                    "token mismatch at offset {o}: detokenizer {id}, SSE {}",
                    slot.q
                ));
            }
            let len = t.frag_len as usize;
            if len == 0 {
                slot.give = t.lead_len;
            }
            self.t_end = o + 1;
            if len == 0 {
                self.push_pending(o, t.lead_len);
                continue;
            }
            let (gives, reach) = self.claim_gives(s, o, t.span_back, t.lead_len)?;
            self.frags.push_back(Frag {
                tok: o,
                first: o - u64::from(t.span_back),
                reach,
                byte_start: byte,
                len: len as u32,
                lead: t.lead_len,
                gives,
            });
            byte += len as u64;
        }
        self.f.extend(r.fragments);
        self.h.extend(r.http_delta.as_bytes());
        self.t_ends.push_back((self.t_end, self.h.len()));
        if self.h.len() > self.f.len() {
            return Err(format!(
                "stream {s}: HTTP text extends beyond the detokenized fragments at byte {}",
                self.f.len()
            ));
        }
        if r.flags & FLAG_FINISHED != 0 {
            self.t_finished = true;
            self.t_reason = r.finish_reason;
            self.t_truncated = r.flags & FLAG_TEXT_TRUNCATED != 0;
            self.t_stop_string = r.flags & (FLAG_TEXT_TRUNCATED | FLAG_TOKENS_TRIMMED) != 0;
            self.t_trimmed_tokens = r.trimmed_tokens;
            self.t_end_rules(s)?;
        }
        Ok(())
    }

    pub(super) fn add_sse(&mut self, s: usize, text: &str, ids: &[u32]) -> Result<(), String> {
        let p_closed = self.p_finished.is_some() || self.p_trimmed;
        for &id in ids {
            let o = self.q_end;
            if p_closed && o >= self.p_end {
                return Err(format!(
                    "stream {s}: SSE token at offset {o} after the scheduler's last step ended at offset {}",
                    self.p_end
                ));
            }
            if self.t_finished && o >= self.t_end {
                return Err(format!(
                    "stream {s}: SSE token at offset {o} after the detokenizer finished at offset {}",
                    self.t_end
                ));
            }
            let slot = self.slot(o);
            slot.q = id;
            slot.has |= HAS_Q;
            if slot.has & HAS_T != 0 && slot.t != id {
                return Err(format!(
                    "token mismatch at offset {o}: detokenizer {}, SSE {id}",
                    slot.t
                ));
            }
            self.q_end = o + 1;
        }
        self.s.extend(text.as_bytes());
        if !text.is_empty() || !ids.is_empty() {
            self.q_ends.push_back((self.q_end, self.s.len()));
        }
        if self.t_finished && self.s.len() > self.h.len() {
            return Err(format!(
                "stream {s}: SSE text extends beyond the HTTP text at byte {}",
                self.h.len()
            ));
        }
        Ok(())
    }
}

impl Stream {
    /// An empty-fragment token at `o` with give count `give` waits for the
    /// fragment that carries its bytes.
    fn push_pending(&mut self, o: u64, give: u16) {
        self.pending_empty += 1;
        if give == LEAD_UNKNOWN && self.first_unknown_give.is_none() {
            self.first_unknown_give = Some(o);
        }
        self.pending_gives.push_back(give);
        if self.pending_gives.len() > MAX_SPAN_BACK {
            // No span_back reaches it any more.
            let lost = self.pending_gives.pop_front().unwrap_or(0);
            if lost != LEAD_UNKNOWN && lost > 0 && self.unreachable_give.is_none() {
                self.unreachable_give = Some((o - MAX_SPAN_BACK as u64, lost));
            }
        }
    }

    /// A fragment at `o` claims its `span_back` predecessors among the pending
    /// empty tokens: none of the others gave bytes (no fragment will carry
    /// them), and the predecessors' known give counts add up to at most its
    /// lead_len, exactly when all are known. Returns whether every give is
    /// known (with lead_len known): then each predecessor owns its own bytes;
    /// and the fragment's reach: an unclaimed token whose give is unknown may
    /// have given any number of its bytes, so the characters may come from it.
    fn claim_gives(
        &mut self,
        s: usize,
        o: u64,
        span_back: u8,
        lead: u16,
    ) -> Result<(bool, u64), String> {
        let b = usize::from(span_back);
        if b as u64 > u64::from(self.pending_empty) {
            return Err(format!(
                "stream {s}: span_back {b} at offset {o} exceeds {} pending tokens",
                self.pending_empty
            ));
        }
        if let Some((at, give)) = self.unreachable_give {
            return Err(format!(
                "stream {s}: token at offset {at} gave {give} bytes that no fragment carries"
            ));
        }
        let held = self.pending_gives.len();
        let unclaimed = held - b;
        if let Some(i) = self
            .pending_gives
            .iter()
            .take(unclaimed)
            .position(|&g| g != LEAD_UNKNOWN && g > 0)
        {
            return Err(format!(
                "stream {s}: token at offset {} gave {} bytes that no fragment carries",
                o - held as u64 + i as u64,
                self.pending_gives[i]
            ));
        }
        let (mut total, mut known) = (0u32, 0usize);
        for &g in self.pending_gives.iter().skip(unclaimed) {
            if g != LEAD_UNKNOWN {
                total += u32::from(g);
                known += 1;
            }
        }
        let first = o - b as u64;
        let reach = self.first_unknown_give.map_or(first, |u| u.min(first));
        // Earlier empty fragments are claimed by this one or never will be.
        self.pending_empty = 0;
        self.pending_gives.clear();
        self.first_unknown_give = None;
        if lead == LEAD_UNKNOWN || b == 0 {
            return Ok((false, reach));
        }
        if total > u32::from(lead) || (known == b && total != u32::from(lead)) {
            return Err(format!(
                "stream {s}: the {b} tokens before offset {o} give {total} bytes, its lead_len says {lead}"
            ));
        }
        Ok((known == b, reach))
    }

    /// Each SSE chunk carries whole steps: it ends where a text record ends
    /// (several records when the HTTP writer merged steps). A chunk is held
    /// against the first text record that ends at or after it once that
    /// record's tokens are confirmed (`c`) and its bytes proven, so a token or
    /// byte mismatch inside it is reported first.
    pub(super) fn chunk_rule(&mut self, s: usize, c: u64) -> Result<(), String> {
        while let Some(&(q, b)) = self.q_ends.front() {
            while self.t_ends.front().is_some_and(|&end| end < (q, b)) {
                self.t_ends.pop_front();
            }
            let Some(&(t, h)) = self.t_ends.front() else {
                return Ok(());
            };
            if t > c || h > self.proven {
                return Ok(());
            }
            if (t, h) != (q, b) {
                return Err(format!(
                    "stream {s}: an SSE chunk ends at offset {q} (byte {b}), inside a text record"
                ));
            }
            self.t_ends.pop_front();
            self.q_ends.pop_front();
        }
        Ok(())
    }
}
