//! Settling records, proving fragments byte by byte, and the span events
//! per character (docs/PROTOCOL.md "Spans (per character)").

use super::*;

impl Reconciler {
    /// Settle records, prove fragments, emit spans and the exact verdict.
    pub(super) fn advance(&mut self, s: usize) {
        if !self.streams[s].open() {
            return;
        }
        let st = &mut self.streams[s];
        let c = st.confirmed_end();
        st.settle_records(c);
        // Proving reads the byte windows, never adds to them.
        let (h_len, s_len) = (st.h.len(), st.s.len());
        if let Some(reason) = self.prove_fragments(s, c, h_len, s_len) {
            return self.fail(s, reason);
        }
        let st = &mut self.streams[s];
        if let Err(reason) = st.chunk_rule(s, c) {
            return self.fail(s, reason);
        }
        st.release_settled(c);
        if st.proves_exact(c, h_len, s_len) {
            st.exact = true;
            st.release_all();
            self.events.push(Event::Exact { stream: s as u16 });
        }
    }

    /// Prove the confirmed fragments of stream `s`, strictly in order, and
    /// emit their spans; the first mismatch's reason, if one differs.
    #[inline(always)]
    fn prove_fragments(&mut self, s: usize, c: u64, h_len: u64, s_len: u64) -> Option<String> {
        // The fields are borrowed apart once (not `self.streams[s]` again per
        // fragment and piece).
        let Reconciler {
            streams,
            events,
            pieces,
            unit_starts,
            input_start,
            packed,
            prove_runs,
            #[cfg(test)]
            runs_proven,
            ..
        } = self;
        let st = &mut streams[s];
        let mut out = SpanOut {
            events,
            packed,
            input_start: *input_start,
            s,
        };
        let h_final = st.t_finished && st.t_truncated;
        // Runs are tried until one differs (then fragment by fragment, which
        // finds and words the first mismatch).
        let mut try_runs = *prove_runs && !h_final;
        while let Some(fr) = st.frags.front().copied() {
            if fr.tok >= c {
                break;
            }
            // Two confirmed fragments at least: a single one is proven as
            // cheaply by the loop below.
            if try_runs && fr.tok == fr.reach && st.frags.get(1).is_some_and(|f| f.tok < c) {
                match st.prove_run(c, h_len.min(s_len), pieces, &mut out) {
                    Some(true) => {
                        #[cfg(test)]
                        {
                            runs_proven[0] += 1;
                        }
                        continue;
                    }
                    Some(false) => {
                        #[cfg(test)]
                        {
                            runs_proven[1] += 1;
                        }
                        try_runs = false;
                    }
                    None => {}
                }
            }
            let fend = fr.byte_start + u64::from(fr.len);
            let limit = if h_final { fend.min(h_len) } else { fend };
            if limit <= fr.byte_start {
                // Entirely beyond the final HTTP text: not output.
                st.frags.pop_front();
                continue;
            }
            if h_len < limit || s_len < limit {
                break;
            }
            let fb = st.f.slice(fr.byte_start, limit);
            let hb = st.h.slice(fr.byte_start, limit);
            let sb = st.s.slice(fr.byte_start, limit);
            if !same3(fb, hb, sb) {
                return Some(byte_mismatch(fr, fb, hb, sb));
            }
            st.proven = limit;
            st.frags.pop_front();
            st.emit_fragment(&fr, limit, pieces, unit_starts, &mut out);
        }
        None
    }
}

/// Where a stream's proven spans go: the run's events, or its packed sink.
struct SpanOut<'a> {
    events: &'a mut Vec<Event>,
    packed: &'a mut Option<SpanSink>,
    /// `events.len()` when the current input began.
    input_start: usize,
    s: usize,
}

impl SpanOut<'_> {
    #[inline(always)]
    fn emit(&mut self, start: u64, text: &str, p: &Piece) {
        emit_span(
            self.events,
            self.packed,
            self.input_start,
            self.s,
            start,
            text,
            p,
        );
    }
}

impl Stream {
    /// Settle the provenance records whose tokens are all confirmed (to `c`;
    /// after a stop string, the surplus beyond the text's end never is).
    #[inline(always)]
    fn settle_records(&mut self, c: u64) {
        let surplus_from = if self.t_finished && self.t_stop_string {
            self.t_end
        } else {
            u64::MAX
        };
        while let Some(r) = self.recs.front().copied() {
            let conf_end = r.end.min(surplus_from);
            if conf_end > c {
                break;
            }
            let confirmed = conf_end.saturating_sub(r.start) as usize;
            if conf_end == r.end {
                // Every token confirmed: the role counts give the same sums.
                self.stats.settle_confirmed(confirmed, r.counts, r.ds, r.dp);
            } else {
                let toks = &self.toks;
                let roles = (r.start..r.end).map(|o| toks.get(o).role);
                self.stats.settle(roles, confirmed, r.ds, r.dp);
            }
            self.recs.pop_front();
        }
    }

    /// Prove the run of fragments from the first unproven one at once
    /// ([`Stream::run_of_fragments`]) when its three byte slices are equal:
    /// Some(true); Some(false) when they differ (the caller goes fragment by
    /// fragment), None when there is no run.
    #[inline(always)]
    fn prove_run(
        &mut self,
        c: u64,
        avail: u64,
        pieces: &mut Vec<Piece>,
        out: &mut SpanOut<'_>,
    ) -> Option<bool> {
        let (n, start, end) = self.run_of_fragments(c, avail, pieces)?;
        let fb = self.f.slice(start, end);
        let hb = self.h.slice(start, end);
        let sb = self.s.slice(start, end);
        if !same3(fb, hb, sb) {
            return Some(false);
        }
        self.proven = end;
        self.stats.bytes += end - start;
        self.frags.drop_front(n);
        for p in pieces.iter() {
            let bytes = &hb[p.from..p.to];
            debug_assert!(std::str::from_utf8(bytes).is_ok());
            // SAFETY: `bytes` are whole fragments (each valid UTF-8 on its
            // own, checked by the decoder) equal to the HTTP bytes at the same
            // place.
            let text = unsafe { std::str::from_utf8_unchecked(bytes) };
            out.emit(start + p.from as u64, text, p);
        }
        Some(true)
    }

    /// The spans of fragment `fr`, proven up to `limit`.
    #[inline(always)]
    fn emit_fragment(
        &mut self,
        fr: &Frag,
        limit: u64,
        pieces: &mut Vec<Piece>,
        unit_starts: &mut Vec<usize>,
        out: &mut SpanOut<'_>,
    ) {
        if fr.tok == fr.reach {
            // No span_back (most fragments): `pieces` would give the one
            // piece of the whole output, with the carrier's step and role,
            // and its bytes are the HTTP bytes (the SAFETY argument below
            // holds for them); so emit it without the pieces buffer.
            let carrier = self.tok(fr.tok);
            let p = Piece {
                from: 0,
                to: (limit - fr.byte_start) as usize,
                step: Some(carrier.ord),
                role: Some(carrier.role),
                first: fr.tok,
                n: 1,
            };
            let hb = self.h.slice(fr.byte_start, limit);
            debug_assert!(std::str::from_utf8(hb).is_ok());
            // SAFETY: as for a piece below (this piece is the whole output).
            let text = unsafe { std::str::from_utf8_unchecked(hb) };
            self.stats.bytes += hb.len() as u64;
            out.emit(fr.byte_start, text, &p);
            return;
        }
        let avail = (limit - fr.byte_start) as usize;
        self.pieces(fr, avail, pieces, unit_starts);
        for p in pieces.iter() {
            let bytes = self
                .h
                .slice(fr.byte_start + p.from as u64, fr.byte_start + p.to as u64);
            debug_assert!(std::str::from_utf8(bytes).is_ok());
            // SAFETY: `bytes` equals the fragment's bytes from a character
            // boundary to a character boundary (pieces are cut at character
            // boundaries of the fragment, which is valid UTF-8 on its own,
            // or at the end of the final HTTP text, which is valid UTF-8
            // and equal to the fragments up to there).
            let text = unsafe { std::str::from_utf8_unchecked(bytes) };
            if p.step.is_none() {
                self.stats.mixed_spans += 1;
            }
            self.stats.bytes += (p.to - p.from) as u64;
            let start = fr.byte_start + p.from as u64;
            out.emit(start, text, p);
        }
    }

    /// Release what nothing needs any more. A later fragment reaches back
    /// over at most the pending empties (its span_back, or an unclaimed one
    /// whose give is unknown).
    #[inline(always)]
    fn release_settled(&mut self, c: u64) {
        let mut keep = c.min(self.t_end - u64::from(self.pending_empty));
        if let Some(r) = self.recs.front() {
            keep = keep.min(r.start);
        }
        if let Some(fr) = self.frags.front() {
            keep = keep.min(fr.reach);
        }
        self.toks.release_before(keep);
        let bytes_keep = self.frags.front().map_or(self.proven, |f| f.byte_start);
        self.f.release_before(bytes_keep);
        self.h.release_before(bytes_keep);
        self.s.release_before(bytes_keep);
    }

    /// Exact? Not vacuously (at least one token), and with the request's
    /// end proven: the scheduler's finish, or a stop string's trimmed tokens
    /// checked against the scheduler's step.
    #[inline(always)]
    fn proves_exact(&self, c: u64, h_len: u64, s_len: u64) -> bool {
        self.sse_finished
            && self.t_finished
            && self.t_end > 0
            && self.q_end == self.t_end
            && c == self.t_end
            && s_len == h_len
            && self.proven >= s_len
            && self.q_ends.is_empty()
            && (if self.t_stop_string {
                self.trim_checked
            } else {
                self.p_finished.is_some()
            })
            && (self.metrics_checked || !self.has_metrics())
    }
}

impl Stream {
    /// The run of fragments from the first unproven one that `advance`'s
    /// fragment loop would prove one by one without cutting any into pieces:
    /// each confirmed (`tok < c`), without `span_back` (one piece with its
    /// carrier's step and role), contiguous with the one before, and with its
    /// bytes all received (`fend <= avail`, the HTTP and SSE lengths; the
    /// caller excludes the final-HTTP-text cut). Writes to `out` the spans the
    /// loop's `emit_span` calls would leave, each fragment merged into the one
    /// before when they share step and role (as `emit_span` merges them: no
    /// other event comes between); `from`/`to` relative to the run's start.
    /// Returns (fragments, byte start, byte end), None when there are none.
    /// When the run's three byte slices are equal, proving it at once gives
    /// the loop's events, stats and `proven`; when they differ the loop runs
    /// fragment by fragment and reports the first mismatch as before.
    /// `run_tests::proved_runs_change_no_event` holds this against a
    /// reconciler that proves fragment by fragment.
    #[inline]
    pub(super) fn run_of_fragments(
        &self,
        c: u64,
        avail: u64,
        out: &mut Vec<Piece>,
    ) -> Option<(usize, u64, u64)> {
        out.clear();
        let start = self.frags.front()?.byte_start;
        let mut end = start;
        let mut n = 0usize;
        for f in self.frags.iter() {
            let fend = end + u64::from(f.len);
            if f.tok >= c || f.tok != f.reach || f.byte_start != end || fend > avail {
                break;
            }
            let t = self.tok(f.tok);
            let (step, role) = (Some(t.ord), Some(t.role));
            let to = (fend - start) as usize;
            match out.last_mut() {
                Some(p) if p.step == step && p.role == role => {
                    p.to = to;
                    p.n = (f.tok + 1 - p.first) as u32;
                }
                _ => out.push(Piece {
                    from: (end - start) as usize,
                    to,
                    step,
                    role,
                    first: f.tok,
                    n: 1,
                }),
            }
            end = fend;
            n += 1;
        }
        (n > 0).then_some((n, start, end))
    }

    /// Where the three witnesses' tokens all reach (`advance`'s `c`).
    #[inline]
    pub(super) fn confirmed_end(&self) -> u64 {
        self.p_end.min(self.t_end).min(self.q_end)
    }

    /// After a provenance record that left the confirmed end at `before`,
    /// `advance` would change nothing, so it need not run (it ran after the
    /// stream's previous input). Provenance often arrives before the text
    /// and SSE that confirm it: on the benchmark workload this skips two in
    /// three of the calls after provenance. Why nothing changes: with `c`
    /// unchanged and the text not finished, the new record (at least one
    /// token, from the old `p_end` >= `c`) cannot settle and holds no token
    /// the release point could pass; fragments, the byte windows, the chunk
    /// and text record ends and `proven` are untouched by provenance, so the
    /// fragment loop and the chunk rule stop where they stopped; and no
    /// verdict can follow while the SSE and the text are unfinished. A
    /// record that finishes or trims the request still goes through.
    #[inline]
    pub(super) fn advance_is_noop_after_provenance(&self, before: u64) -> bool {
        self.confirmed_end() == before
            && !self.t_finished
            && !self.sse_finished
            && self.p_finished.is_none()
            && !self.p_trimmed
            && self.open()
    }

    /// After an unfinished text record that left the confirmed end at
    /// `before`, when no fragment was waiting for HTTP or SSE bytes (the
    /// first unproven one, if any, was not yet confirmed), `advance` would
    /// change nothing that matters: the new fragments start at the old
    /// `t_end` >= `c`, so none is confirmed; no record can settle; the chunk
    /// rule only compares a text record end > `c` (its one possible change,
    /// dropping passed text record ends, happens identically at the next
    /// call); and the tokens the release point could now pass are released
    /// at the stream's next `advance` instead (never more than up to `c`,
    /// which did not move). On the benchmark workload this skips half the calls after
    /// text records (text often arrives before the SSE it confirms).
    #[inline]
    pub(super) fn advance_is_noop_after_text(&self, before: u64) -> bool {
        self.confirmed_end() == before && !self.t_finished && self.open()
    }

    /// After an SSE delta (the SSE body not finished: `sse_open`) that left
    /// the confirmed end at `before`, when no fragment was waiting for HTTP
    /// or SSE bytes, `advance` would change nothing that matters. The delta
    /// arrived before the text record that confirms its tokens (on the
    /// benchmark workload 26,257 of 53,893 deltas: `advance` after deltas
    /// ran 27,636 times). Why: the delta touches only `q_end`, the SSE
    /// bytes, `q_ends` and the `q` of tokens at or beyond the old `q_end`.
    /// With `c` and the text unchanged no record settles (the loop reads
    /// `c`, `t_end`, the text's finish and `recs`). The first unproven
    /// fragment, if any, has `tok >= c` (else it was waiting), so the
    /// fragment loop stops at once and `proven` and the stats stay. The
    /// chunk rule stopped at its first chunk end before, and stops there
    /// again (`c`, `proven` and the text record ends before it unchanged);
    /// if it had none, the new end `(q, b)` meets a text record end
    /// `(t, h) >= (q, b)`: with token ids `t >= q > c` (the new `q_end` is
    /// past the old one, which is `>= c`); without, `b` is beyond the old
    /// SSE bytes, so `t > c` or `h >= b > proven`. Either way it stops
    /// without a verdict, and the text record ends it would drop before
    /// stopping are dropped alike at the next call. Nothing the release
    /// point reads changed. No verdict: the SSE body is not finished.
    /// `skip_tests::skipped_advance_changes_no_event` holds this against a
    /// reconciler that never skips.
    #[inline]
    pub(super) fn advance_is_noop_after_sse(&self, before: u64) -> bool {
        self.confirmed_end() == before && !self.t_finished && self.open()
    }

    /// The first unproven fragment's token is below the confirmed end
    /// `before`: it waits for HTTP or SSE bytes, so the skips above apply
    /// only if it still does after the input ([`Stream::front_still_waits`]).
    #[inline]
    pub(super) fn fragment_waits_for_bytes(&self, before: u64) -> bool {
        self.frags.front().is_some_and(|f| f.tok < before)
    }

    /// After an input that left the text unfinished, the first unproven
    /// fragment (which waited for bytes before it) still lacks HTTP or SSE
    /// bytes: `advance`'s fragment loop stops at it at once, as when no
    /// fragment waits, so the `advance_is_noop_after_text`/`_sse` arguments
    /// hold unchanged. (With the text unfinished no final-HTTP-text cut
    /// applies, so the fragment's limit is its end; a run of fragments from
    /// it is empty, since it does not fit in the bytes either.) On the
    /// benchmark workload a fragment often waits for the SSE delta's bytes
    /// while the HTTP text holds them back: about 8,000 more skips.
    #[inline]
    pub(super) fn front_still_waits(&self) -> bool {
        self.frags.front().is_some_and(|f| {
            let fend = f.byte_start + u64::from(f.len);
            self.h.len() < fend || self.s.len() < fend
        })
    }
}

/// Emit one piece as a span, or extend the previous span of this input
/// when it is the same stream, step and role and ends where this starts.
#[inline(always)]
pub(super) fn emit_span(
    events: &mut Vec<Event>,
    packed: &mut Option<SpanSink>,
    input_start: usize,
    s: usize,
    start: u64,
    text: &str,
    p: &Piece,
) {
    if let Some(sink) = packed {
        return pack_span(sink, events.len(), s, start, text.len(), p);
    }
    let last_offset = p.first + u64::from(p.n) - 1;
    if p.step.is_some() && events.len() > input_start {
        if let Some(Event::Span {
            stream: last_stream,
            byte_start: last_start,
            text: last_text,
            step: last_step,
            first_offset: last_first,
            n_tokens: last_n,
            role: last_role,
        }) = events.last_mut()
        {
            if usize::from(*last_stream) == s
                && *last_step == p.step
                && *last_role == p.role
                && *last_start + last_text.len() as u64 == start
            {
                last_text.push_str(text);
                *last_n = (last_offset + 1 - *last_first) as u32;
                return;
            }
        }
    }
    // The event is written where it lies in the vector, its text appended
    // there: a span built aside (across `push`'s growth check) and then
    // moved is re-read right after its bytes were written piecewise, which
    // stalls the store buffer (perf: a fifth of `advance`'s cycles).
    events.reserve(1);
    events.spare_capacity_mut()[0].write(Event::Span {
        stream: s as u16,
        byte_start: start,
        text: SpanText::default(),
        step: p.step,
        first_offset: p.first,
        n_tokens: p.n,
        role: p.role,
    });
    // SAFETY: the first spare slot was just initialized (reserve(1) made one).
    unsafe { events.set_len(events.len() + 1) };
    if let Some(Event::Span { text: t, .. }) = events.last_mut() {
        t.push_str(text);
    }
}

/// [`emit_span`] in packed mode: the same merge rule on the same spans,
/// without their text and token range. Events mode merges when the last event
/// is a span of this input (`events.len() > input_start`) of the same
/// stream, step and role ending at `start`; here the last span is of this
/// input when `spans.len() > sink.input_start` and is the last event when no
/// event was pushed since (`events_at_last`). `Fed`'s test
/// `packed_mode_gives_the_spans_of_events_mode` compares both modes.
#[inline]
fn pack_span(sink: &mut SpanSink, events_len: usize, s: usize, start: u64, len: usize, p: &Piece) {
    let end = start + len as u64;
    if p.step.is_some() && sink.spans.len() > sink.input_start && sink.events_at_last == events_len
    {
        if let Some(last) = sink.spans.last_mut() {
            if usize::from(last.stream) == s
                && last.step == p.step
                && last.role == p.role
                && last.byte_end == start
            {
                last.byte_end = end;
                return;
            }
        }
    }
    sink.spans.push(PackedSpan {
        stream: s as u16,
        role: p.role,
        step: p.step,
        byte_start: start,
        byte_end: end,
    });
    sink.events_at_last = events_len;
}

impl Stream {
    /// Cut a proven fragment (its first `avail` bytes are output) into runs
    /// of characters attributed alike (docs/PROTOCOL.md "Spans"), written to
    /// `out`. The fragment's bytes are owned by units (token ranges): with
    /// every give count known, each predecessor its gives and the carrier the
    /// rest; with only lead_len known, the predecessors together the first
    /// lead_len bytes and the carrier the rest; else all its tokens the whole
    /// fragment. A character's tokens are those of the units overlapping it,
    /// first to last, and from the fragment's reach on (an unclaimed token
    /// of unknown give may have given any of them); a piece is a maximal run
    /// of characters with the same tokens.
    #[inline]
    pub(super) fn pieces(
        &self,
        fr: &Frag,
        avail: usize,
        out: &mut Vec<Piece>,
        starts: &mut Vec<usize>,
    ) {
        out.clear();
        let len = fr.len as usize;
        if fr.tok == fr.first || fr.lead == LEAD_UNKNOWN {
            // One unit: the carrier alone (the common case), or all its
            // tokens when the split is unknown.
            let (step, role) = self.shared(fr.reach, fr.tok + 1);
            out.push(Piece {
                from: 0,
                to: avail,
                step,
                role,
                first: fr.reach,
                n: (fr.tok + 1 - fr.reach) as u32,
            });
            return;
        }
        let frag = self.f.slice(fr.byte_start, fr.byte_start + len as u64);
        let lead = usize::from(fr.lead);
        // The units in order: unit `u` owns bytes `starts[u]..starts[u + 1]`
        // and tokens `unit_tok(u)..unit_tok(u + 1)`. With every give known,
        // one unit per token (the predecessors' gives, then the carrier's
        // rest); else two: the predecessors together (`lead` bytes), then
        // the carrier. `starts` is a kept buffer: a fresh 257-word array
        // per fragment was zeroed each time, the largest single cost of the
        // packed run in callgrind.
        starts.clear();
        if fr.gives {
            let mut at = 0usize;
            for o in fr.first..fr.tok {
                starts.push(at);
                at += usize::from(self.tok(o).give);
            }
            starts.push(at);
            starts.push(len);
        } else {
            starts.extend_from_slice(&[0, lead, len]);
        }
        let starts = &starts[..];
        let unit_count = starts.len() - 1;
        let unit_tok = |u: usize| -> u64 {
            if fr.gives || u == 0 {
                fr.first + u as u64
            } else {
                fr.tok + u as u64 - 1
            }
        };
        let mut first_unit = 0usize;
        let mut pos = 0usize;
        while pos < avail {
            // Skip the units that end at or before this character.
            while first_unit + 1 < unit_count && starts[first_unit + 1] <= pos {
                first_unit += 1;
            }
            // The characters from `pos` that end within the first unit (at
            // most at `x`, where the next unit starts) overlap it alone: one
            // character at a time each would get the same tokens and merge
            // into one piece. So they are taken at once, up to `q`, the last
            // character boundary at or before `x`; only a character across a
            // unit boundary is taken alone.
            let x = if first_unit + 1 < unit_count {
                starts[first_unit + 1]
            } else {
                len
            };
            let mut q = x;
            while q > pos && q < len && is_continuation(frag[q]) {
                q -= 1;
            }
            let mut end = if q > pos { q } else { pos + 1 };
            while end < len && is_continuation(frag[end]) {
                end += 1;
            }
            let mut last_unit = first_unit;
            while last_unit + 1 < unit_count && starts[last_unit + 1] < end {
                last_unit += 1;
            }
            let low = if fr.reach < fr.first {
                fr.reach
            } else {
                unit_tok(first_unit)
            };
            let high = unit_tok(last_unit + 1);
            let end = end.min(avail);
            match out.last_mut() {
                Some(p) if p.first == low && u64::from(p.n) == high - low => p.to = end,
                _ => {
                    let (step, role) = self.shared(low, high);
                    out.push(Piece {
                        from: pos,
                        to: end,
                        step,
                        role,
                        first: low,
                        n: (high - low) as u32,
                    });
                }
            }
            pos = end;
        }
    }

    /// The step and role shared by every token in `from..to`, else None.
    pub(super) fn shared(&self, from: u64, to: u64) -> (Option<u32>, Option<u8>) {
        let t0 = self.tok(from);
        let (mut step, mut role) = (Some(t0.ord), Some(t0.role));
        for o in from + 1..to {
            let t = self.tok(o);
            if step != Some(t.ord) {
                step = None;
            }
            if role != Some(t.role) {
                role = None;
            }
        }
        (step, role)
    }
}

/// `a == b && b == c` for slices of equal length. Up to 16 bytes (most
/// fragments and runs) they are compared as two overlapping words each (or
/// halves, or the first, middle and last byte): a fixed dozen instructions,
/// not a loop of several per byte.
#[inline]
pub(super) fn same3(a: &[u8], b: &[u8], c: &[u8]) -> bool {
    let n = a.len();
    debug_assert!(b.len() == n && c.len() == n);
    if b.len() != n || c.len() != n {
        return false;
    }
    if n > 16 {
        return a == b && b == c;
    }
    if n >= 8 {
        let w = |s: &[u8], i: usize| u64::from_le_bytes(s[i..i + 8].try_into().unwrap_or([0; 8]));
        let d = |i| (w(a, i) ^ w(b, i)) | (w(b, i) ^ w(c, i));
        return d(0) | d(n - 8) == 0;
    }
    if n >= 4 {
        let w = |s: &[u8], i: usize| u32::from_le_bytes(s[i..i + 4].try_into().unwrap_or([0; 4]));
        let d = |i| (w(a, i) ^ w(b, i)) | (w(b, i) ^ w(c, i));
        return d(0) | d(n - 4) == 0;
    }
    if n == 0 {
        return true;
    }
    let d = |i: usize| (a[i] ^ b[i]) | (b[i] ^ c[i]);
    d(0) | d(n / 2) | d(n - 1) == 0
}

/// The first differing byte: fragment vs HTTP over the whole fragment first,
/// then HTTP vs SSE.
pub(super) fn byte_mismatch(fr: Frag, fb: &[u8], hb: &[u8], sb: &[u8]) -> String {
    if let Some(j) = fb.iter().zip(hb).position(|(a, b)| a != b) {
        return format!(
            "byte mismatch at offset {} (byte {}): detokenizer fragment vs HTTP delta",
            fr.tok,
            fr.byte_start + j as u64
        );
    }
    let j = hb.iter().zip(sb).position(|(a, b)| a != b).unwrap_or(0);
    format!(
        "byte mismatch at offset {} (byte {}): HTTP delta vs SSE",
        fr.tok,
        fr.byte_start + j as u64
    )
}

#[inline]
pub(super) fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

/// One run of characters of a fragment attributed alike.
#[derive(Clone, Copy, Debug)]
pub(super) struct Piece {
    /// Byte range relative to the fragment start.
    pub(super) from: usize,
    pub(super) to: usize,
    pub(super) step: Option<u32>,
    pub(super) role: Option<u8>,
    pub(super) first: u64,
    pub(super) n: u32,
}
