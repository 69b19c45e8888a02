//! The three-witness reconciler (docs/PROTOCOL.md "Reconciliation").
//!
//! Per stream it joins, by absolute token offset, the scheduler's provenance
//! (P), the detokenizer's text records (T) and the SSE deltas the client
//! received (Q), and compares the byte streams F (fragments), H (HTTP deltas)
//! and S (SSE text) byte by byte. Verified spans are emitted as soon as they
//! are proven, then dropped: memory holds only what is not yet verified (plus
//! at most 255 tokens that a later fragment's `span_back` may reach back to).

use std::collections::{HashMap, VecDeque};
use std::fmt;

use crate::encode::HelloFields;
use crate::protocol::{
    self, Body, DecodeError, Frame, Hello, NoticeRecord, ProvRecord, TextRecord, ALL_STREAMS,
    FLAG_FINISHED, FLAG_TEXT_TRUNCATED,
};
use crate::sequence::{Offer, SeqTracker};
use crate::stats::{Counters, Stats};
use crate::text::SpanText;
use crate::window::ByteWindow;

/// Largest `num_streams`.
pub const MAX_STREAMS: u32 = 65_535;

/// Hello role values.
pub const ROLE_SCHEDULER: u8 = 1;
pub const ROLE_FRONTEND: u8 = 2;

/// An event, in the order it happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A proven fragment (or its part inside the final HTTP text).
    Span {
        stream: u16,
        byte_start: u64,
        text: SpanText,
        /// Ordinal of the provenance step within the stream; None for a mixed
        /// span (tokens of two or more steps).
        step: Option<u32>,
        first_offset: u64,
        n_tokens: u32,
    },
    Exact {
        stream: u16,
    },
    Failed {
        stream: u16,
        reason: String,
    },
    /// A run-level message.
    Run {
        message: String,
    },
}

/// A stream's verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pending,
    Exact,
    Failed(String),
}

/// An invalid argument; `Display` is the Python `ValueError` message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgError {
    RunId(String),
    NumStreams(String),
    Stream { stream: String, n: u16 },
    TokenId(String),
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgError::RunId(s) => write!(
                f,
                "invalid run id '{s}': expected 32 lowercase hex characters"
            ),
            ArgError::NumStreams(n) => write!(f, "num_streams {n} out of range 1..=65535"),
            ArgError::Stream { stream, n } => write!(f, "stream {stream} out of range 0..{n}"),
            ArgError::TokenId(t) => write!(f, "token id {t} out of range 0..=4294967295"),
        }
    }
}

impl std::error::Error for ArgError {}

/// What a hello announced, and which source sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceInfo {
    pub source_id: u64,
    pub hello: HelloFields,
}

impl SourceInfo {
    fn from_hello(source_id: u64, h: &Hello<'_>) -> Self {
        SourceInfo {
            source_id,
            hello: HelloFields::from(h),
        }
    }

    pub fn role_name(&self) -> &'static str {
        role_name(self.hello.role)
    }

    pub fn engine_name(&self) -> &'static str {
        if self.hello.engine == 1 {
            "vllm"
        } else {
            "simulated"
        }
    }

    pub fn role_derivation_name(&self) -> &'static str {
        match self.hello.role_derivation {
            0 => "none",
            1 => "draft_ids",
            _ => "counts",
        }
    }
}

fn role_name(role: u8) -> &'static str {
    if role == ROLE_SCHEDULER {
        "scheduler"
    } else {
        "frontend"
    }
}

/// Parse a run id: 32 lowercase hex characters.
pub fn parse_run_id(s: &str) -> Result<[u8; 16], ArgError> {
    let b = s.as_bytes();
    let hex = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    if b.len() != 32 {
        return Err(ArgError::RunId(s.to_owned()));
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        match (hex(b[2 * i]), hex(b[2 * i + 1])) {
            (Some(h), Some(l)) => *o = h << 4 | l,
            _ => return Err(ArgError::RunId(s.to_owned())),
        }
    }
    Ok(out)
}

/// Lowercase hex of a run id.
pub fn run_id_hex(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

const HAS_P: u8 = 1;
const HAS_T: u8 = 2;
const HAS_Q: u8 = 4;

/// What the three witnesses said about one token offset.
#[derive(Clone, Copy, Debug, Default)]
struct Tok {
    p: u32,
    t: u32,
    q: u32,
    has: u8,
    role: u8,
    ord: u32,
}

/// An unsettled provenance record.
#[derive(Clone, Copy, Debug)]
struct PRec {
    start: u64,
    end: u64,
    ds: u16,
    dp: u16,
}

/// An unproven non-empty fragment.
#[derive(Clone, Copy, Debug)]
struct Frag {
    /// Offset of the token that carries it.
    tok: u64,
    /// Offset of its first token (`tok - span_back`).
    first: u64,
    byte_start: u64,
    len: u32,
}

#[derive(Debug, Default)]
struct Stream {
    failed: Option<String>,
    exact: bool,
    /// Offset of `toks[0]`.
    base: u64,
    toks: VecDeque<Tok>,
    p_end: u64,
    t_end: u64,
    q_end: u64,
    p_src: Option<u64>,
    t_src: Option<u64>,
    /// Ordinal of the next provenance record.
    ord: u32,
    recs: VecDeque<PRec>,
    t_finished: bool,
    t_truncated: bool,
    pending_empty: u32,
    frags: VecDeque<Frag>,
    f: ByteWindow,
    h: ByteWindow,
    s: ByteWindow,
    /// End of the proven bytes.
    proven: u64,
    sse_finished: bool,
    stats: Stats,
}

impl Stream {
    #[inline]
    fn open(&self) -> bool {
        !self.exact && self.failed.is_none()
    }

    /// The slot of offset `o`, which is at most one past the retained tokens.
    #[inline]
    fn slot(&mut self, o: u64) -> &mut Tok {
        let i = (o - self.base) as usize;
        if i == self.toks.len() {
            self.toks.push_back(Tok::default());
        }
        &mut self.toks[i]
    }

    #[inline]
    fn tok(&self, o: u64) -> &Tok {
        &self.toks[(o - self.base) as usize]
    }

    /// Release everything once the stream has its verdict.
    fn release_all(&mut self) {
        self.toks = VecDeque::new();
        self.recs = VecDeque::new();
        self.frags = VecDeque::new();
        self.f.clear();
        self.h.clear();
        self.s.clear();
    }
}

struct Source {
    seq: SeqTracker<Vec<u8>>,
    /// Role from its hello, once released.
    role: Option<u8>,
    /// Its first released frame was not a hello: the rest is ignored.
    broken: bool,
}

/// The reconciler of one client run.
pub struct Reconciler {
    run_id: [u8; 16],
    streams: Vec<Stream>,
    sources: HashMap<u64, Source>,
    /// Source ids in order of their first admitted frame.
    source_order: Vec<u64>,
    infos: Vec<SourceInfo>,
    events: Vec<Event>,
    counters: Counters,
    admitted: bool,
    /// Index of the first event produced by the input being processed: only
    /// spans of the same input are merged, so merging never depends on drains.
    input_start: usize,
}

impl Reconciler {
    /// A reconciler for `run_id` (32 lowercase hex) with `num_streams`
    /// streams (1..=65535).
    pub fn new(run_id: &str, num_streams: u32) -> Result<Self, ArgError> {
        let run_id = parse_run_id(run_id)?;
        if !(1..=MAX_STREAMS).contains(&num_streams) {
            return Err(ArgError::NumStreams(num_streams.to_string()));
        }
        Ok(Self::with_run_id(run_id, num_streams as u16))
    }

    /// A reconciler for a run id given as raw bytes.
    pub fn with_run_id(run_id: [u8; 16], num_streams: u16) -> Self {
        let num_streams = num_streams.max(1);
        Reconciler {
            run_id,
            streams: (0..num_streams).map(|_| Stream::default()).collect(),
            sources: HashMap::new(),
            source_order: Vec::new(),
            infos: Vec::new(),
            events: Vec::new(),
            counters: Counters::default(),
            admitted: false,
            input_start: 0,
        }
    }

    pub fn run_id(&self) -> &[u8; 16] {
        &self.run_id
    }

    pub fn num_streams(&self) -> u16 {
        self.streams.len() as u16
    }

    /// Check a stream index given by a caller.
    pub fn check_stream(&self, stream: i64) -> Result<u16, ArgError> {
        if stream < 0 || stream >= self.streams.len() as i64 {
            return Err(ArgError::Stream {
                stream: stream.to_string(),
                n: self.num_streams(),
            });
        }
        Ok(stream as u16)
    }

    /// Count a datagram rejected before decoding (e.g. by the receiver).
    pub fn reject(&mut self, reason: String) {
        self.counters.frames += 1;
        self.reject_message(reason);
    }

    /// Telemetry lost between the server and this client, not by a sender
    /// (docs/PROTOCOL.md, "Lost telemetry"): `Some(n)` frames the server's hub
    /// discarded for this client (a `dropped` item), `None` an unknown number
    /// (the telemetry stream ended before the run). Every stream without a
    /// verdict fails, since its records may be among the lost frames; `Some(0)`
    /// lost nothing.
    pub fn push_lost(&mut self, frames: Option<u64>) {
        self.input_start = self.events.len();
        let reason = match frames {
            Some(0) => return,
            Some(n) => format!("telemetry lost: {n} frames dropped by the server"),
            None => "telemetry lost: the telemetry stream ended before the run".to_owned(),
        };
        self.fail_all(&reason);
    }

    // ----------------------------------------------------------------- frames

    /// Push one datagram.
    pub fn push_frame(&mut self, data: &[u8]) {
        self.input_start = self.events.len();
        self.counters.frames += 1;
        let frame = match protocol::decode(data) {
            Ok(f) => f,
            Err(e) => return self.rejected(&e),
        };
        let h = frame.header;
        if h.run_id != self.run_id {
            return self.reject_message(format!(
                "frame for run {}, expected {}",
                run_id_hex(&h.run_id),
                run_id_hex(&self.run_id)
            ));
        }
        self.admitted = true;
        let source = match self.sources.get_mut(&h.source_id) {
            Some(s) => s,
            None => {
                self.source_order.push(h.source_id);
                self.sources.entry(h.source_id).or_insert(Source {
                    seq: SeqTracker::default(),
                    role: None,
                    broken: false,
                })
            }
        };
        // A buffered frame keeps its bytes and is decoded again when released.
        match source.seq.offer(h.seq, || data.to_vec()) {
            Offer::Duplicate => self.counters.duplicate_frames += 1,
            Offer::Buffered => {}
            Offer::Release => {
                self.release(&frame);
                self.drain_source(h.source_id);
            }
            Offer::Gap { missing } => {
                self.counters.gaps += 1;
                self.fail_all(&format!(
                    "frames lost: gap in source {:016x} at seq {missing}",
                    h.source_id
                ));
                self.drain_source(h.source_id);
            }
        }
    }

    /// Push several datagrams.
    pub fn push_frames<'a>(&mut self, frames: impl IntoIterator<Item = &'a [u8]>) {
        for f in frames {
            self.push_frame(f);
        }
    }

    fn rejected(&mut self, e: &DecodeError) {
        self.reject_message(e.to_string());
    }

    /// A rejected frame: counted, and reported as a run event.
    fn reject_message(&mut self, message: String) {
        self.counters.rejected_frames += 1;
        self.events.push(Event::Run {
            message: format!("rejected frame: {message}"),
        });
    }

    fn drain_source(&mut self, source_id: u64) {
        loop {
            let Some(bytes) = self
                .sources
                .get_mut(&source_id)
                .and_then(|s| s.seq.pop_ready())
            else {
                return;
            };
            if let Ok(frame) = protocol::decode(&bytes) {
                self.release(&frame);
            }
        }
    }

    /// Process a frame released in sequence order.
    fn release(&mut self, frame: &Frame<'_>) {
        let h = &frame.header;
        let src = h.source_id;
        let Some(source) = self.sources.get_mut(&src) else {
            return;
        };
        if source.broken {
            return;
        }
        let kind = h.kind.name();
        match (&frame.body, source.role) {
            (Body::Hello(_), Some(_)) => {
                return self.reject_message(format!("second hello from source {src:016x}"));
            }
            (Body::Hello(hello), None) => {
                source.role = Some(hello.role);
                self.infos.push(SourceInfo::from_hello(src, hello));
            }
            (_, None) => {
                source.broken = true;
                return self
                    .run_failure(format!("source {src:016x}: {kind} frame before its hello"));
            }
            (Body::Provenance(_), Some(role)) if role != ROLE_SCHEDULER => {
                return self.run_failure(format!(
                    "source {src:016x}: {kind} frame from a {} source",
                    role_name(role)
                ));
            }
            (Body::Text(_), Some(role)) if role != ROLE_FRONTEND => {
                return self.run_failure(format!(
                    "source {src:016x}: {kind} frame from a {} source",
                    role_name(role)
                ));
            }
            _ => {}
        }
        self.counters.dropped_reported += u64::from(h.dropped);
        if h.dropped > 0 {
            self.fail_all(&format!(
                "frames lost: source {src:016x} dropped {} frames before seq {}",
                h.dropped, h.seq
            ));
        }
        match &frame.body {
            Body::Provenance(recs) => {
                for r in recs {
                    self.on_provenance(src, r);
                }
            }
            Body::Text(recs) => {
                for r in recs {
                    self.on_text(src, r);
                }
            }
            Body::Notice(recs) => {
                for r in recs {
                    self.on_notice(src, r);
                }
            }
            Body::Hello(_) => {}
        }
    }

    fn run_failure(&mut self, message: String) {
        self.events.push(Event::Run {
            message: message.clone(),
        });
        self.fail_all(&message);
    }

    fn fail_all(&mut self, reason: &str) {
        for s in 0..self.streams.len() {
            if self.streams[s].open() {
                self.fail(s, reason.to_owned());
            }
        }
    }

    fn fail(&mut self, s: usize, reason: String) {
        let st = &mut self.streams[s];
        if !st.open() {
            return;
        }
        st.release_all();
        st.failed = Some(reason.clone());
        self.events.push(Event::Failed {
            stream: s as u16,
            reason,
        });
    }

    /// Index of an open stream named by a record, counting foreign records.
    fn record_stream(&mut self, stream: u16) -> Option<usize> {
        let s = stream as usize;
        if s >= self.streams.len() {
            self.counters.foreign_records += 1;
            return None;
        }
        self.streams[s].open().then_some(s)
    }

    fn on_notice(&mut self, src: u64, r: &NoticeRecord<'_>) {
        let reason = format!(
            "not exact: {} (notice {} from source {src:016x})",
            r.message, r.code
        );
        if r.stream == ALL_STREAMS {
            self.fail_all(&reason);
        } else if let Some(s) = self.record_stream(r.stream) {
            self.fail(s, reason);
        }
    }

    fn on_provenance(&mut self, src: u64, r: &ProvRecord<'_>) {
        let Some(s) = self.record_stream(r.stream) else {
            return;
        };
        if let Err(reason) = self.streams[s].add_provenance(s, src, r) {
            return self.fail(s, reason);
        }
        self.advance(s);
    }

    fn on_text(&mut self, src: u64, r: &TextRecord<'_>) {
        let Some(s) = self.record_stream(r.stream) else {
            return;
        };
        if let Err(reason) = self.streams[s].add_text(s, src, r) {
            return self.fail(s, reason);
        }
        self.advance(s);
    }

    // -------------------------------------------------------------------- SSE

    /// One SSE delta of a stream: its text and token ids.
    pub fn push_sse(&mut self, stream: u16, text: &str, token_ids: &[u32]) {
        self.input_start = self.events.len();
        let s = stream as usize;
        if s >= self.streams.len() || !self.streams[s].open() {
            return;
        }
        if let Err(reason) = self.streams[s].add_sse(s, text, token_ids) {
            return self.fail(s, reason);
        }
        self.advance(s);
    }

    /// The stream's SSE ended normally.
    pub fn finish_sse(&mut self, stream: u16) {
        self.input_start = self.events.len();
        let s = stream as usize;
        if s >= self.streams.len() || !self.streams[s].open() {
            return;
        }
        self.streams[s].sse_finished = true;
        self.advance(s);
    }

    // --------------------------------------------------------------- progress

    /// Settle records, prove fragments, emit spans and the exact verdict.
    fn advance(&mut self, s: usize) {
        let st = &mut self.streams[s];
        let c = st.p_end.min(st.t_end).min(st.q_end);
        let truncated_end = if st.t_finished && st.t_truncated {
            st.t_end
        } else {
            u64::MAX
        };
        // Settle provenance records.
        while let Some(r) = st.recs.front().copied() {
            let conf_end = r.end.min(truncated_end);
            if conf_end > c {
                break;
            }
            let confirmed = conf_end.saturating_sub(r.start) as usize;
            let base = st.base;
            let toks = &st.toks;
            let roles = (r.start..r.end).map(|o| toks[(o - base) as usize].role);
            st.stats.settle(roles, confirmed, r.ds, r.dp);
            st.recs.pop_front();
        }
        // Prove fragments, strictly in order.
        let h_len = st.h.len();
        let s_len = st.s.len();
        while let Some(fr) = st.frags.front().copied() {
            if fr.tok >= c {
                break;
            }
            let fend = fr.byte_start + u64::from(fr.len);
            let limit = if truncated_end != u64::MAX {
                fend.min(h_len)
            } else {
                fend
            };
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
                let reason = byte_mismatch(fr, fb, hb, sb);
                self.fail(s, reason);
                return;
            }
            debug_assert!(std::str::from_utf8(hb).is_ok());
            // SAFETY: `hb` equals `fb`, which is a whole fragment (each was
            // checked to be valid UTF-8 when decoded) or, when the final HTTP
            // text ends inside it, H's tail from a fragment start: H is valid
            // UTF-8 (every delta was checked) and equals F up to here, so the
            // fragment start is a character boundary of H.
            let text = SpanText::new(unsafe { std::str::from_utf8_unchecked(hb) });
            let first_ord = st.tok(fr.first).ord;
            let last_ord = st.tok(fr.tok).ord;
            let step = (first_ord == last_ord).then_some(first_ord);
            if step.is_none() {
                st.stats.mixed_spans += 1;
            }
            st.stats.bytes += limit - fr.byte_start;
            st.proven = limit;
            st.frags.pop_front();
            let end_offset = fr.tok + 1;
            if step.is_some() && self.events.len() > self.input_start {
                if let Some(Event::Span {
                    stream: last_stream,
                    byte_start: last_start,
                    text: last_text,
                    step: last_step,
                    first_offset: last_first,
                    n_tokens: last_n,
                }) = self.events.last_mut()
                {
                    // The same step, contiguous, proven by the same input: one span.
                    if usize::from(*last_stream) == s
                        && *last_step == step
                        && *last_start + last_text.len() as u64 == fr.byte_start
                    {
                        let mut joined = String::with_capacity(last_text.len() + text.len());
                        joined.push_str(last_text);
                        joined.push_str(&text);
                        *last_text = SpanText::new(&joined);
                        *last_n = (end_offset - *last_first) as u32;
                        continue;
                    }
                }
            }
            self.events.push(Event::Span {
                stream: s as u16,
                byte_start: fr.byte_start,
                text,
                step,
                first_offset: fr.first,
                n_tokens: (end_offset - fr.first) as u32,
            });
        }
        // Release what nothing needs any more.
        // A later fragment's span_back reaches back over at most the pending empties.
        let mut keep = c.min(
            st.t_end
                .saturating_sub(u64::from(st.pending_empty.min(255))),
        );
        if let Some(r) = st.recs.front() {
            keep = keep.min(r.start);
        }
        if let Some(fr) = st.frags.front() {
            keep = keep.min(fr.first);
        }
        if keep > st.base {
            let n = ((keep - st.base) as usize).min(st.toks.len());
            st.toks.drain(..n);
            st.base += n as u64;
        }
        let bytes_keep = st.frags.front().map_or(st.proven, |f| f.byte_start);
        st.f.release_before(bytes_keep);
        st.h.release_before(bytes_keep);
        st.s.release_before(bytes_keep);
        // Exact?
        if st.sse_finished
            && st.t_finished
            && st.q_end == st.t_end
            && c == st.t_end
            && s_len == h_len
            && st.proven >= s_len
        {
            st.exact = true;
            st.release_all();
            self.events.push(Event::Exact { stream: s as u16 });
        }
    }

    /// The client gives up waiting: every open stream gets its verdict.
    pub fn finalize(&mut self) {
        let gap = self.source_order.iter().find_map(|id| {
            let src = &self.sources[id];
            (src.seq.buffered_len() > 0).then(|| (*id, src.seq.next_expected()))
        });
        for s in 0..self.streams.len() {
            if !self.streams[s].open() {
                continue;
            }
            let reason = self.final_reason(s, gap);
            self.fail(s, reason);
        }
    }

    fn final_reason(&self, s: usize, gap: Option<(u64, u64)>) -> String {
        let st = &self.streams[s];
        if let Some((id, seq)) = gap {
            return format!("frames lost: gap in source {id:016x} at seq {seq}");
        }
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

    // ---------------------------------------------------------------- queries

    /// The events since the previous call.
    pub fn drain(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// Append the events since the previous call to `out`; the reconciler
    /// keeps its buffer (no allocation in steady state).
    pub fn drain_into(&mut self, out: &mut Vec<Event>) {
        out.append(&mut self.events);
    }

    /// Events waiting to be drained.
    pub fn pending_events(&self) -> usize {
        self.events.len()
    }

    pub fn verdict(&self, stream: u16) -> Verdict {
        let st = &self.streams[stream as usize];
        if st.exact {
            Verdict::Exact
        } else if let Some(r) = &st.failed {
            Verdict::Failed(r.clone())
        } else {
            Verdict::Pending
        }
    }

    pub fn stream_stats(&self, stream: u16) -> &Stats {
        &self.streams[stream as usize].stats
    }

    pub fn totals(&self) -> Stats {
        let mut t = Stats::default();
        for st in &self.streams {
            t.add(&st.stats);
        }
        t
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    pub fn sources(&self) -> &[SourceInfo] {
        &self.infos
    }

    /// Tokens and bytes currently held for verification (for memory tests).
    pub fn retained(&self) -> (usize, usize) {
        let mut toks = 0;
        let mut bytes = 0;
        for st in &self.streams {
            toks += st.toks.len();
            bytes += st.f.retained() + st.h.retained() + st.s.retained();
        }
        (toks, bytes)
    }
}

/// `a == b && b == c` for slices of equal length (short ones compared inline).
#[inline]
fn same3(a: &[u8], b: &[u8], c: &[u8]) -> bool {
    if a.len() <= 16 {
        let mut diff = 0u8;
        for ((x, y), z) in a.iter().zip(b).zip(c) {
            diff |= (x ^ y) | (y ^ z);
        }
        diff == 0
    } else {
        a == b && b == c
    }
}

/// The first differing byte: fragment vs HTTP over the whole fragment first,
/// then HTTP vs SSE.
fn byte_mismatch(fr: Frag, fb: &[u8], hb: &[u8], sb: &[u8]) -> String {
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

impl Stream {
    fn add_provenance(&mut self, s: usize, src: u64, r: &ProvRecord<'_>) -> Result<(), String> {
        match self.p_src {
            None => self.p_src = Some(src),
            Some(x) if x != src => {
                return Err(format!(
                    "stream {s}: provenance from a second source {src:016x}"
                ))
            }
            Some(_) => {}
        }
        let offset = u64::from(r.offset);
        if offset != self.p_end {
            return Err(format!(
                "provenance offset {offset} for stream {s}, expected {}",
                self.p_end
            ));
        }
        // The step ordinal is the index of the record within the stream.
        let ord = self.ord;
        self.ord += 1;
        let beyond_fails = self.t_finished && !self.t_truncated;
        let t_end = self.t_end;
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
            end: offset + r.len() as u64,
            ds: r.drafts_scheduled,
            dp: r.drafts_padded,
        });
        Ok(())
    }

    fn add_text(&mut self, s: usize, src: u64, r: &TextRecord<'_>) -> Result<(), String> {
        match self.t_src {
            None => self.t_src = Some(src),
            Some(x) if x != src => {
                return Err(format!("stream {s}: text from a second source {src:016x}"))
            }
            Some(_) => {}
        }
        if self.t_finished {
            return Err(format!("stream {s}: text after finish"));
        }
        let offset = u64::from(r.offset);
        if offset != self.t_end {
            return Err(format!(
                "text offset {offset} for stream {s}, expected {}",
                self.t_end
            ));
        }
        let mut byte = self.f.len();
        for (i, t) in r.tokens().enumerate() {
            let o = offset + i as u64;
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
            self.t_end = o + 1;
            let len = t.frag_len as usize;
            if len == 0 {
                self.pending_empty += 1;
                continue;
            }
            let b = u32::from(t.span_back);
            if b > self.pending_empty {
                return Err(format!(
                    "stream {s}: span_back {b} at offset {o} exceeds {} pending tokens",
                    self.pending_empty
                ));
            }
            // Earlier empty fragments are claimed by this one or never will be.
            self.pending_empty = 0;
            self.frags.push_back(Frag {
                tok: o,
                first: o - u64::from(b),
                byte_start: byte,
                len: len as u32,
            });
            byte += len as u64;
        }
        self.f.extend(r.fragments);
        self.h.extend(r.http_delta.as_bytes());
        if self.h.len() > self.f.len() {
            return Err(format!(
                "stream {s}: HTTP text extends beyond the detokenized fragments at byte {}",
                self.f.len()
            ));
        }
        if r.flags & FLAG_FINISHED != 0 {
            self.t_finished = true;
            self.t_truncated = r.flags & FLAG_TEXT_TRUNCATED != 0;
            if !self.t_truncated && self.p_end > self.t_end {
                return Err(format!(
                    "stream {s}: provenance beyond the end of the request at offset {}",
                    self.t_end
                ));
            }
            if self.s.len() > self.h.len() {
                return Err(format!(
                    "stream {s}: SSE text extends beyond the HTTP text at byte {}",
                    self.h.len()
                ));
            }
        }
        Ok(())
    }

    fn add_sse(&mut self, s: usize, text: &str, ids: &[u32]) -> Result<(), String> {
        for &id in ids {
            let o = self.q_end;
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
        if self.t_finished && self.s.len() > self.h.len() {
            return Err(format!(
                "stream {s}: SSE text extends beyond the HTTP text at byte {}",
                self.h.len()
            ));
        }
        Ok(())
    }
}
