//! The three-witness reconciler (docs/PROTOCOL.md "Reconciliation").
//!
//! Per stream it joins, by absolute token offset, the scheduler's provenance
//! (P), the detokenizer's text records (T) and the SSE deltas the client
//! received (Q), and compares the byte streams F (fragments), H (HTTP deltas)
//! and S (SSE text) byte by byte. Verified spans are emitted as soon as they
//! are proven, then dropped: memory holds only what is not yet verified (plus
//! at most 255 tokens that a later fragment's `span_back` may reach back to).
//!
//! A stream's verdict is final only after [`Reconciler::finalize`]: until
//! then contradicting evidence revokes an exact verdict.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;

use crate::digest::FrameDigest;
use crate::encode::HelloFields;
use crate::protocol::{
    self, finish_name, Body, DecodeError, Frame, Hello, NoticeRecord, ProvRecord, TextRecord,
    ALL_STREAMS, FLAG_FINISHED, FLAG_TEXT_TRUNCATED, FLAG_TOKENS_TRIMMED, FLAG_TRIMMED,
    LEAD_UNKNOWN, ROLE_ACCEPTED,
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

/// The run message of the first frame pushed after `finalize()`.
pub const LATE_MESSAGE: &str =
    "telemetry arrived after the verdicts were final: not used (counted in late_frames)";

/// An event, in the order it happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A run of proven characters (of one fragment, or merged from several).
    Span {
        stream: u16,
        byte_start: u64,
        text: SpanText,
        /// Ordinal of the provenance step within the stream; None for a mixed
        /// span (a character with bytes from tokens of two or more steps).
        step: Option<u32>,
        first_offset: u64,
        n_tokens: u32,
        /// The token role shared by every token the characters come from.
        role: Option<u8>,
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
    ChoiceIndex(String),
    CompletionTokens(String),
    StepCount(String),
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
            ArgError::ChoiceIndex(i) => write!(f, "choice index {i} out of range 0..=4294967295"),
            ArgError::CompletionTokens(n) => write!(
                f,
                "completion_tokens {n} out of range 0..=18446744073709551615"
            ),
            ArgError::StepCount(n) => write!(f, "per-step count {n} out of range 0..=4294967295"),
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
        engine_name(self.hello.engine)
    }

    pub fn role_derivation_name(&self) -> &'static str {
        match self.hello.role_derivation {
            0 => "none",
            1 => "draft_ids",
            _ => "counts",
        }
    }

    pub fn verification_name(&self) -> &'static str {
        match self.hello.verification {
            0 => "none",
            1 => "standard",
            2 => "synthetic",
            3 => "fly",
            _ => "unknown",
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

fn engine_name(engine: u8) -> &'static str {
    if engine == 1 {
        "vllm"
    } else {
        "simulated"
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
    /// Bytes from the span_back predecessors ([`LEAD_UNKNOWN`]: not known).
    lead: u16,
}

/// A provenance record with drafts, for the cross-check with vLLM's
/// per-request metrics (which list exactly those steps, in order).
#[derive(Clone, Copy, Debug)]
struct SpecStep {
    offset: u64,
    /// `drafts_scheduled - drafts_padded`.
    drafted: u16,
    /// Accepted drafts among the record's tokens.
    accepted: u16,
    /// The record was trimmed: vLLM counted its acceptance before the cut.
    trimmed: bool,
}

/// What the usage chunk said (the last one pushed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Usage {
    completion_tokens: Option<u64>,
    per_step_accepted: Option<Vec<u32>>,
    per_step_drafted: Option<Vec<u32>>,
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
    /// Header step of the stream's last provenance / text record.
    p_step: Option<u64>,
    t_step: Option<u64>,
    /// Ordinal of the next provenance record.
    ord: u32,
    recs: VecDeque<PRec>,
    /// The scheduler's finish reason once a record said finished.
    p_finished: Option<u8>,
    /// The last provenance record was trimmed (nothing may follow it).
    p_trimmed: bool,
    t_finished: bool,
    t_reason: u8,
    t_trimmed_tokens: u16,
    /// A stop-string finish's trimmed tokens were checked against the
    /// scheduler's step holding the text's last token.
    trim_checked: bool,
    /// The records with drafts, in order (the fourth witness lists them).
    spec_steps: Vec<SpecStep>,
    /// vLLM's per-request metrics were checked against them.
    metrics_checked: bool,
    /// T finished because of a stop string (text_truncated or tokens_trimmed):
    /// provenance beyond its end is surplus.
    t_stop_string: bool,
    /// The final HTTP text stops inside or before the fragments.
    t_truncated: bool,
    pending_empty: u32,
    frags: VecDeque<Frag>,
    f: ByteWindow,
    h: ByteWindow,
    s: ByteWindow,
    /// End of the proven bytes.
    proven: u64,
    sse_finished: bool,
    sse_reason: Option<String>,
    sse_id: Option<String>,
    usage: Option<Usage>,
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
        self.spec_steps = Vec::new();
        self.frags = VecDeque::new();
        self.f.clear();
        self.h.clear();
        self.s.clear();
    }
}

struct Source {
    seq: SeqTracker<Vec<u8>>,
    /// Keyed digest of every frame received, by sequence number: a
    /// duplicate must be byte-identical.
    digests: BTreeMap<u64, u64>,
    /// Role from its hello, once released.
    role: Option<u8>,
    /// Index of its hello in `infos`.
    info: usize,
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
    /// `finalize()` ran: nothing changes any more.
    finalized: bool,
    /// The key of the duplicate digests (random per reconciler: a sender
    /// cannot craft two frames with the same digest).
    digest: FrameDigest,
    /// Index of the first event produced by the input being processed: only
    /// spans of the same input are merged, so merging never depends on drains.
    input_start: usize,
}

/// One run of characters of a fragment attributed alike.
#[derive(Clone, Copy, Debug)]
struct Piece {
    /// Byte range relative to the fragment start.
    from: usize,
    to: usize,
    step: Option<u32>,
    role: Option<u8>,
    first: u64,
    n: u32,
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
            finalized: false,
            digest: FrameDigest::new(),
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
        if self.finalized {
            return self.late_frame();
        }
        self.reject_message(reason);
    }

    // ----------------------------------------------------------------- frames

    /// Push one datagram.
    pub fn push_frame(&mut self, data: &[u8]) {
        self.input_start = self.events.len();
        self.counters.frames += 1;
        if self.finalized {
            return self.late_frame();
        }
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
        let digest = self.digest.digest(data);
        let source = match self.sources.get_mut(&h.source_id) {
            Some(s) => s,
            None => {
                self.source_order.push(h.source_id);
                self.sources.entry(h.source_id).or_insert(Source {
                    seq: SeqTracker::default(),
                    digests: BTreeMap::new(),
                    role: None,
                    info: 0,
                    broken: false,
                })
            }
        };
        // A buffered frame keeps its bytes and is decoded again when released.
        match source.seq.offer(h.seq, || data.to_vec()) {
            Offer::Duplicate => {
                self.counters.duplicate_frames += 1;
                // A sequence number given up after a gap has no digest: nothing to compare.
                if source.digests.get(&h.seq).is_some_and(|&d| d != digest) {
                    self.run_failure(format!(
                        "source {:016x}: seq {} received twice with different content",
                        h.source_id, h.seq
                    ));
                }
            }
            Offer::Buffered => {
                source.digests.insert(h.seq, digest);
            }
            Offer::Release => {
                source.digests.insert(h.seq, digest);
                self.release(&frame);
                self.drain_source(h.source_id);
            }
            Offer::Gap { missing } => {
                self.counters.gaps += 1;
                source.digests.insert(h.seq, digest);
                self.fail_open(&format!(
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

    /// A frame after `finalize()`: counted, reported once, not used.
    fn late_frame(&mut self) {
        self.counters.late_frames += 1;
        if self.counters.late_frames == 1 {
            self.events.push(Event::Run {
                message: LATE_MESSAGE.to_owned(),
            });
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
                source.info = self.infos.len();
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
            self.fail_open(&format!(
                "frames lost: source {src:016x} dropped {} frames before seq {}",
                h.dropped, h.seq
            ));
        }
        match &frame.body {
            Body::Provenance(recs) => {
                let k = self.infos[source_info(&self.sources, src)]
                    .hello
                    .num_speculative_tokens;
                for r in recs {
                    self.on_provenance(src, h.step, k, r);
                }
            }
            Body::Text(recs) => {
                for r in recs {
                    self.on_text(src, h.step, r);
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

    /// The run's telemetry contradicts itself: a run event, then every
    /// stream without a final verdict fails (an exact one is revoked).
    fn run_failure(&mut self, message: String) {
        self.events.push(Event::Run {
            message: message.clone(),
        });
        for s in 0..self.streams.len() {
            self.fail(s, message.clone());
        }
    }

    /// Frames were lost: every stream still open fails (a loss contradicts
    /// nothing a complete stream was proven with).
    fn fail_open(&mut self, reason: &str) {
        for s in 0..self.streams.len() {
            if self.streams[s].open() {
                self.fail(s, reason.to_owned());
            }
        }
    }

    /// Fail an open stream, or revoke an exact one (before `finalize()`).
    fn fail(&mut self, s: usize, reason: String) {
        let st = &mut self.streams[s];
        if st.failed.is_some() || self.finalized {
            return;
        }
        st.release_all();
        st.exact = false;
        st.failed = Some(reason.clone());
        self.events.push(Event::Failed {
            stream: s as u16,
            reason,
        });
    }

    /// Index of a stream named by a record whose verdict may still change,
    /// counting foreign records.
    fn record_stream(&mut self, stream: u16) -> Option<usize> {
        let s = stream as usize;
        if s >= self.streams.len() {
            self.counters.foreign_records += 1;
            return None;
        }
        self.streams[s].failed.is_none().then_some(s)
    }

    fn on_notice(&mut self, src: u64, r: &NoticeRecord<'_>) {
        let reason = format!(
            "not exact: {} (notice {} from source {src:016x})",
            r.message, r.code
        );
        if r.stream == ALL_STREAMS {
            for s in 0..self.streams.len() {
                self.fail(s, reason.clone());
            }
        } else if let Some(s) = self.record_stream(r.stream) {
            self.fail(s, reason);
        }
    }

    fn on_provenance(&mut self, src: u64, step: u64, k: u16, r: &ProvRecord<'_>) {
        let Some(s) = self.record_stream(r.stream) else {
            return;
        };
        let st = &self.streams[s];
        let pair = match (st.p_src, st.t_src) {
            (None, Some(t)) => self.hello_pair(s, src, t),
            _ => None,
        };
        if let Err(reason) = self.streams[s].add_provenance(s, src, step, k, pair, r) {
            return self.fail(s, reason);
        }
        self.advance(s);
    }

    fn on_text(&mut self, src: u64, step: u64, r: &TextRecord<'_>) {
        let Some(s) = self.record_stream(r.stream) else {
            return;
        };
        let st = &self.streams[s];
        let pair = match (st.p_src, st.t_src) {
            (Some(p), None) => self.hello_pair(s, p, src),
            _ => None,
        };
        if let Err(reason) = self.streams[s].add_text(s, src, step, pair, r) {
            return self.fail(s, reason);
        }
        self.advance(s);
    }

    /// The scheduler's and the frontend's hellos of a stream must name the
    /// same engine, engine version and plugin version.
    fn hello_pair(&self, s: usize, sched: u64, front: u64) -> Option<String> {
        let a = &self.infos[self.sources[&sched].info];
        let b = &self.infos[self.sources[&front].info];
        let fields = [
            ("engine", a.engine_name(), b.engine_name()),
            (
                "engine_version",
                a.hello.engine_version.as_str(),
                b.hello.engine_version.as_str(),
            ),
            (
                "plugin_version",
                a.hello.plugin_version.as_str(),
                b.hello.plugin_version.as_str(),
            ),
        ];
        fields.iter().find(|(_, x, y)| x != y).map(|(field, x, y)| {
            format!(
                "stream {s}: the scheduler's and the frontend's hellos disagree on {field} \
                 ('{x}' vs '{y}')"
            )
        })
    }

    // -------------------------------------------------------------------- SSE

    /// The stream an SSE input is for, if it can still change.
    fn sse_stream(&mut self, stream: u16) -> Option<usize> {
        self.input_start = self.events.len();
        let s = stream as usize;
        if self.finalized || s >= self.streams.len() || self.streams[s].failed.is_some() {
            return None;
        }
        Some(s)
    }

    /// The stream an SSE input is for, if it can still change and its SSE
    /// body has not ended (SSE data after the end is a contradiction).
    fn sse_open(&mut self, stream: u16) -> Option<usize> {
        let s = self.sse_stream(stream)?;
        if self.streams[s].sse_finished {
            self.fail(s, format!("stream {s}: SSE data after the stream finished"));
            return None;
        }
        Some(s)
    }

    /// One SSE delta of a stream (its choice 0): text and token ids.
    pub fn push_sse(&mut self, stream: u16, text: &str, token_ids: &[u32]) {
        let Some(s) = self.sse_open(stream) else {
            return;
        };
        if let Err(reason) = self.streams[s].add_sse(s, text, token_ids) {
            return self.fail(s, reason);
        }
        self.advance(s);
    }

    /// The `id` of the stream's SSE chunks (pushed for its first chunk and
    /// whenever it differs from the previous chunk's): it must carry the
    /// stream's request id and never change.
    pub fn push_sse_id(&mut self, stream: u16, chunk_id: &str) {
        let Some(s) = self.sse_open(stream) else {
            return;
        };
        let request_id = format!("ph1_{}_{s}", run_id_hex(&self.run_id));
        let st = &mut self.streams[s];
        let reason = if !carries_request_id(chunk_id, &request_id) {
            format!("stream {s}: SSE chunk id does not carry the request id {request_id}")
        } else if st.sse_id.as_deref().is_some_and(|id| id != chunk_id) {
            format!("stream {s}: SSE chunk id changed mid-stream")
        } else {
            st.sse_id = Some(chunk_id.to_owned());
            return;
        };
        self.fail(s, reason);
    }

    /// The stream's chunks carried a choice other than the single choice 0:
    /// another choice's text may be in what the client showed.
    pub fn push_sse_choice(&mut self, stream: u16, index: u32) {
        let Some(s) = self.sse_open(stream) else {
            return;
        };
        self.fail(
            s,
            format!("stream {s}: SSE chunk with a choice other than the single choice 0 (index {index})"),
        );
    }

    /// The usage chunk: `usage.completion_tokens` and vLLM's per-request
    /// speculative-decoding metrics (`metrics.speculative_decoding`).
    pub fn push_sse_usage(
        &mut self,
        stream: u16,
        completion_tokens: Option<u64>,
        per_step_accepted: Option<&[u32]>,
        per_step_drafted: Option<&[u32]>,
    ) {
        let Some(s) = self.sse_open(stream) else {
            return;
        };
        let st = &mut self.streams[s];
        st.usage = Some(Usage {
            completion_tokens,
            per_step_accepted: per_step_accepted.map(<[u32]>::to_vec),
            per_step_drafted: per_step_drafted.map(<[u32]>::to_vec),
        });
        st.metrics_checked = false;
        if let Err(reason) = st.metrics_rules(s) {
            self.fail(s, reason);
        }
    }

    /// The stream's SSE body ended normally; `finish_reason` is the last
    /// non-null `finish_reason` of its choice 0.
    pub fn finish_sse(&mut self, stream: u16, finish_reason: Option<&str>) {
        let Some(s) = self.sse_open(stream) else {
            return;
        };
        let st = &mut self.streams[s];
        st.sse_finished = true;
        st.sse_reason = finish_reason.map(str::to_owned);
        if let Err(reason) = st.sse_end_rules(s) {
            return self.fail(s, reason);
        }
        self.advance(s);
    }

    // --------------------------------------------------------------- progress

    /// Settle records, prove fragments, emit spans and the exact verdict.
    fn advance(&mut self, s: usize) {
        if !self.streams[s].open() {
            return;
        }
        let st = &mut self.streams[s];
        let c = st.p_end.min(st.t_end).min(st.q_end);
        let surplus_from = if st.t_finished && st.t_stop_string {
            st.t_end
        } else {
            u64::MAX
        };
        // Settle provenance records.
        while let Some(r) = st.recs.front().copied() {
            let conf_end = r.end.min(surplus_from);
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
        let h_final = st.t_finished && st.t_truncated;
        while let Some(fr) = self.streams[s].frags.front().copied() {
            let st = &mut self.streams[s];
            if fr.tok >= c {
                break;
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
                let reason = byte_mismatch(fr, fb, hb, sb);
                self.fail(s, reason);
                return;
            }
            let mut pieces = [Piece {
                from: 0,
                to: 0,
                step: None,
                role: None,
                first: 0,
                n: 0,
            }; 3];
            let n_pieces = st.pieces(&fr, (limit - fr.byte_start) as usize, &mut pieces);
            st.proven = limit;
            st.frags.pop_front();
            for p in &pieces[..n_pieces] {
                let st = &mut self.streams[s];
                let bytes =
                    st.h.slice(fr.byte_start + p.from as u64, fr.byte_start + p.to as u64);
                debug_assert!(std::str::from_utf8(bytes).is_ok());
                // SAFETY: `bytes` equals the fragment's bytes from a character
                // boundary to a character boundary (pieces are cut at character
                // boundaries of the fragment, which is valid UTF-8 on its own,
                // or at the end of the final HTTP text, which is valid UTF-8
                // and equal to the fragments up to there).
                let text = SpanText::new(unsafe { std::str::from_utf8_unchecked(bytes) });
                if p.step.is_none() {
                    st.stats.mixed_spans += 1;
                }
                st.stats.bytes += (p.to - p.from) as u64;
                let start = fr.byte_start + p.from as u64;
                self.emit_span(s, start, text, p);
            }
        }
        let st = &mut self.streams[s];
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
        // Exact? Not vacuously (at least one token), and with the request's
        // end proven: the scheduler's finish, or a stop string's trimmed tokens
        // checked against the scheduler's step.
        if st.sse_finished
            && st.t_finished
            && st.t_end > 0
            && st.q_end == st.t_end
            && c == st.t_end
            && s_len == h_len
            && st.proven >= s_len
            && (if st.t_stop_string {
                st.trim_checked
            } else {
                st.p_finished.is_some()
            })
            && (st.metrics_checked || !st.has_metrics())
        {
            st.exact = true;
            st.release_all();
            self.events.push(Event::Exact { stream: s as u16 });
        }
    }

    /// Emit one piece as a span, or extend the previous span of this input
    /// when it is the same stream, step and role and ends where this starts.
    fn emit_span(&mut self, s: usize, start: u64, text: SpanText, p: &Piece) {
        let last_offset = p.first + u64::from(p.n) - 1;
        if p.step.is_some() && self.events.len() > self.input_start {
            if let Some(Event::Span {
                stream: last_stream,
                byte_start: last_start,
                text: last_text,
                step: last_step,
                first_offset: last_first,
                n_tokens: last_n,
                role: last_role,
            }) = self.events.last_mut()
            {
                if usize::from(*last_stream) == s
                    && *last_step == p.step
                    && *last_role == p.role
                    && *last_start + last_text.len() as u64 == start
                {
                    let mut joined = String::with_capacity(last_text.len() + text.len());
                    joined.push_str(last_text);
                    joined.push_str(&text);
                    *last_text = SpanText::new(&joined);
                    *last_n = (last_offset + 1 - *last_first) as u32;
                    return;
                }
            }
        }
        self.events.push(Event::Span {
            stream: s as u16,
            byte_start: start,
            text,
            step: p.step,
            first_offset: p.first,
            n_tokens: p.n,
            role: p.role,
        });
    }

    /// The client gives up waiting: every open stream gets its verdict, and
    /// every verdict is final.
    pub fn finalize(&mut self) {
        if self.finalized {
            return;
        }
        self.input_start = self.events.len();
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
        self.finalized = true;
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

    /// The stream's verdict; final only once `finalize()` ran.
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

    /// `finalize()` ran: every verdict is final.
    pub fn is_final(&self) -> bool {
        self.finalized
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

fn source_info(sources: &HashMap<u64, Source>, src: u64) -> usize {
    sources.get(&src).map_or(0, |s| s.info)
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

#[inline]
fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

/// `chunk_id` holds `request_id` (`ph1_<run>_<stream>`) not followed by
/// another digit (`ph1_<run>_1` is not in `..._12`).
fn carries_request_id(chunk_id: &str, request_id: &str) -> bool {
    chunk_id.match_indices(request_id).any(|(i, m)| {
        !chunk_id[i + m.len()..]
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_digit())
    })
}

/// An SSE finish_reason as shown in a message: quoted (at most 40
/// characters), or null.
fn shown_reason(reason: Option<&str>) -> String {
    match reason {
        None => "null".to_owned(),
        Some(r) if r.chars().count() > 40 => {
            format!("'{}…'", r.chars().take(40).collect::<String>())
        }
        Some(r) => format!("'{r}'"),
    }
}

impl Stream {
    /// Cut a proven fragment (its first `avail` bytes are output) into runs
    /// of characters attributed alike (docs/PROTOCOL.md "Spans"): the
    /// characters whose bytes all come from the span_back predecessors, the
    /// one character with bytes from both, and the carrier's own characters.
    /// Returns the number of pieces written.
    #[inline]
    fn pieces(&self, fr: &Frag, avail: usize, out: &mut [Piece; 3]) -> usize {
        let carrier = self.tok(fr.tok);
        let (c_step, c_role) = (carrier.ord, carrier.role);
        let len = fr.len as usize;
        let span_back = (fr.tok - fr.first) as u32;
        if span_back == 0 {
            // The common case: the token's own bytes only.
            out[0] = Piece {
                from: 0,
                to: avail,
                step: Some(c_step),
                role: Some(c_role),
                first: fr.tok,
                n: 1,
            };
            return 1;
        }
        // What the predecessors share (all tokens of the group when the split is unknown).
        let mut g_step = Some(c_step);
        let mut g_role = Some(c_role);
        let mut p_step: Option<u32> = None;
        let mut p_role: Option<u8> = None;
        for (i, o) in (fr.first..fr.tok).enumerate() {
            let t = self.tok(o);
            if i == 0 {
                p_step = Some(t.ord);
                p_role = Some(t.role);
            } else {
                if p_step != Some(t.ord) {
                    p_step = None;
                }
                if p_role != Some(t.role) {
                    p_role = None;
                }
            }
        }
        if span_back > 0 {
            if p_step != g_step {
                g_step = None;
            }
            if p_role != g_role {
                g_role = None;
            }
        }
        if span_back == 0 || fr.lead == LEAD_UNKNOWN {
            out[0] = Piece {
                from: 0,
                to: avail,
                step: g_step,
                role: g_role,
                first: fr.first,
                n: span_back + 1,
            };
            return 1;
        }
        let frag = self.f.slice(fr.byte_start, fr.byte_start + len as u64);
        let lead = usize::from(fr.lead);
        let mut a = lead;
        while a > 0 && a < len && is_continuation(frag[a]) {
            a -= 1;
        }
        let mut b = lead;
        while b < len && is_continuation(frag[b]) {
            b += 1;
        }
        let candidates = [
            Piece {
                from: 0,
                to: a,
                step: p_step,
                role: p_role,
                first: fr.first,
                n: span_back,
            },
            Piece {
                from: a,
                to: b,
                step: g_step,
                role: g_role,
                first: fr.first,
                n: span_back + 1,
            },
            Piece {
                from: b,
                to: len,
                step: Some(c_step),
                role: Some(c_role),
                first: fr.tok,
                n: 1,
            },
        ];
        let mut n = 0;
        for mut p in candidates {
            p.to = p.to.min(avail);
            if p.from < p.to {
                out[n] = p;
                n += 1;
            }
        }
        n
    }

    fn add_provenance(
        &mut self,
        s: usize,
        src: u64,
        step: u64,
        k: u16,
        pair: Option<String>,
        r: &ProvRecord<'_>,
    ) -> Result<(), String> {
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
        // The step ordinal is the index of the record within the stream.
        let ord = self.ord;
        self.ord += 1;
        let beyond_fails = self.t_finished && !self.t_stop_string;
        let t_end = self.t_end;
        let end = offset + r.len() as u64;
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
                end,
                ds: r.drafts_scheduled,
                dp: r.drafts_padded,
            });
        }
        if r.drafts_scheduled > 0 {
            self.spec_steps.push(SpecStep {
                offset,
                drafted: r.drafts_scheduled - r.drafts_padded,
                accepted: r.roles.iter().filter(|&&x| x == ROLE_ACCEPTED).count() as u16,
                trimmed: r.flags & FLAG_TRIMMED != 0,
            });
        }
        // The step holding the stop-string text's last token (offset t_end − 1).
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
        if self.p_finished.is_some() {
            self.metrics_rules(s)?;
        }
        Ok(())
    }

    /// vLLM's per-request metrics (`per_step_accepted` / `per_step_drafted`)
    /// are present.
    fn has_metrics(&self) -> bool {
        self.usage
            .as_ref()
            .is_some_and(|u| u.per_step_accepted.is_some() || u.per_step_drafted.is_some())
    }

    /// The fourth witness: vLLM's per-request metrics list the scheduler's
    /// steps with drafts, in order, with their accepted and drafted counts
    /// (accepted counted before a stop cut the step). Checked once both the
    /// lists and the scheduler's finish are known.
    fn metrics_rules(&mut self, s: usize) -> Result<(), String> {
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

    /// The scheduler's last step ended at `p_end`: no token of the other
    /// witnesses beyond it, and the same finish as the detokenizer's.
    fn p_closed_rules(&self, s: usize) -> Result<(), String> {
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
    fn finish_pair(&self, s: usize) -> Result<(), String> {
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
    fn check_trim(&mut self, s: usize, step_end: u64) -> Result<(), String> {
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

    fn add_text(
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
                lead: t.lead_len,
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
            self.t_reason = r.finish_reason;
            self.t_truncated = r.flags & FLAG_TEXT_TRUNCATED != 0;
            self.t_stop_string = r.flags & (FLAG_TEXT_TRUNCATED | FLAG_TOKENS_TRIMMED) != 0;
            self.t_trimmed_tokens = r.trimmed_tokens;
            self.t_end_rules(s)?;
        }
        Ok(())
    }

    /// The detokenizer finished the request: how it ended must agree with
    /// its own bytes, the scheduler and the SSE.
    fn t_end_rules(&mut self, s: usize) -> Result<(), String> {
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
    fn sse_reason_rule(&self, s: usize) -> Result<(), String> {
        let t = finish_name(self.t_reason);
        if self.sse_reason.as_deref() != Some(t) {
            return Err(format!(
                "stream {s}: SSE finish_reason {}, the detokenizer finished with '{t}'",
                shown_reason(self.sse_reason.as_deref())
            ));
        }
        Ok(())
    }

    /// The SSE body ended: it must have carried the stream's chunk id, a
    /// usage count equal to its tokens, and the detokenizer's finish reason.
    fn sse_end_rules(&self, s: usize) -> Result<(), String> {
        if self.sse_id.is_none() {
            return Err(format!("stream {s}: no SSE chunk id"));
        }
        if let Some(n) = self.usage.as_ref().and_then(|u| u.completion_tokens) {
            if n != self.q_end {
                return Err(format!(
                    "stream {s}: usage.completion_tokens {n}, but the SSE carried {} tokens",
                    self.q_end
                ));
            }
        }
        if self.t_finished {
            self.sse_reason_rule(s)?;
        }
        Ok(())
    }

    fn add_sse(&mut self, s: usize, text: &str, ids: &[u32]) -> Result<(), String> {
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
        if self.t_finished && self.s.len() > self.h.len() {
            return Err(format!(
                "stream {s}: SSE text extends beyond the HTTP text at byte {}",
                self.h.len()
            ));
        }
        Ok(())
    }
}
