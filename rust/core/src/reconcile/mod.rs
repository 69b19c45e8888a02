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
//!
//! The state lives here; each concern in its own module: `admission`
//! (frames, sources, duplicates, losses), `stream` (the per-stream join),
//! `ending` (how a request ends), `metrics` (the fourth witness),
//! `sse_witness` (the client's SSE inputs), `prove` (bytes, spans),
//! `finalize`; `args` and `source` hold what callers and hellos give.

mod admission;
mod args;
mod ending;
mod fifo;
mod finalize;
mod metrics;
mod prove;
mod source;
mod sse_witness;
mod stream;
mod tokens;

#[cfg(test)]
mod prove_tests;
#[cfg(test)]
mod run_tests;
#[cfg(test)]
mod skip_tests;

pub use args::{parse_run_id, run_id_hex, ArgError};
pub use source::SourceInfo;

use source::{role_name, source_info, Digests, Source, Sources};

use fifo::Fifo;

use crate::digest::FrameDigest;
use crate::protocol::{
    self, finish_name, Body, DecodeError, Frame, NoticeRecord, ProvRecord, TextRecord, ALL_STREAMS,
    FLAG_FINISHED, FLAG_TEXT_TRUNCATED, FLAG_TOKENS_TRIMMED, FLAG_TRIMMED, LEAD_UNKNOWN,
    ROLE_ACCEPTED,
};
use crate::sequence::{Offer, SeqTracker};
use crate::stats::{Counters, Stats};
use crate::text::SpanText;
use crate::window::ByteWindow;

/// Largest `span_back` (a `u8`): how far back a fragment can claim tokens.
const MAX_SPAN_BACK: usize = 255;

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

/// A span as [`crate::fed::Fed::take`] packs it: no text, no token range.
/// In packed mode ([`Reconciler::pack_spans`]) spans go here instead of
/// becoming [`Event::Span`]s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackedSpan {
    pub stream: u16,
    pub role: Option<u8>,
    pub step: Option<u32>,
    pub byte_start: u64,
    pub byte_end: u64,
}

/// Where the spans of a reconciler in packed mode go.
#[derive(Debug, Default)]
pub(super) struct SpanSink {
    pub(super) spans: Vec<PackedSpan>,
    /// `spans.len()` when the current input began (as `input_start`).
    pub(super) input_start: usize,
    /// `events.len()` right after the last span was pushed or extended: equal
    /// to `events.len()` now exactly when no other event followed it (events
    /// are only drained between inputs, and merging needs a span of the same
    /// input), i.e. when the span would be the last event in events mode.
    pub(super) events_at_last: usize,
}

/// A stream's verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pending,
    Exact,
    Failed(String),
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
    /// An empty-fragment token's give count (text `lead_len`; [`LEAD_UNKNOWN`]: not known).
    give: u16,
    ord: u32,
}

/// An unsettled provenance record.
#[derive(Clone, Copy, Debug)]
struct PRec {
    start: u64,
    end: u64,
    ds: u16,
    dp: u16,
    /// Tokens per role (plain, accepted, target, bonus): settling a record
    /// whose tokens are all confirmed needs no walk over them.
    counts: [u16; 4],
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
    /// The first token that may have given bytes: `first`, or an earlier
    /// pending token it does not claim whose give count is unknown.
    reach: u64,
    /// Bytes from the span_back predecessors ([`LEAD_UNKNOWN`]: not known).
    lead: u16,
    /// Every predecessor's give count is known (and they add up to `lead`):
    /// each predecessor owns its own bytes.
    gives: bool,
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

/// vLLM's per-request metrics as first received: `per_step_accepted` and
/// `per_step_drafted`, kept and never replaced (evidence is monotone).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Metrics {
    accepted: Vec<u32>,
    drafted: Vec<u32>,
}

/// One stream's state. The fields are laid out in the order the inputs use
/// them (`repr(C)`, each stream on its own cache lines): what every input
/// reads first (ends, flags, the token ring), then the queues and byte
/// windows that records and chunks append to and `advance` reads, then the
/// counters, then what only the ends of a request touch. 64 streams' state
/// does not stay in L1 between a step's provenance, text and SSE inputs;
/// the declaration order saves cache lines per input, nothing else (Rust's
/// own layout orders fields by size and scatters the hot ones).
#[derive(Debug, Default)]
#[repr(C, align(64))]
struct Stream {
    // --- every input (the first line: what most inputs read first)
    failed: Option<String>,
    p_end: u64,
    t_end: u64,
    q_end: u64,
    /// End of the proven bytes.
    proven: u64,
    /// Ordinal of the next provenance record.
    ord: u32,
    exact: bool,
    /// The last provenance record was trimmed (nothing may follow it).
    p_trimmed: bool,
    t_finished: bool,
    sse_finished: bool,
    // (the second line)
    /// Empty-fragment tokens since the last fragment (the tokens just before
    /// `t_end`); the give counts of the last [`MAX_SPAN_BACK`] of them (the
    /// only ones a fragment's span_back can reach), and the first earlier one
    /// that gave bytes (offset, give): no fragment can carry those.
    pending_empty: u32,
    /// The scheduler's finish reason once a record said finished.
    p_finished: Option<u8>,
    /// T finished because of a stop string (text_truncated or tokens_trimmed):
    /// provenance beyond its end is surplus.
    t_stop_string: bool,
    /// The final HTTP text stops inside or before the fragments.
    t_truncated: bool,
    t_reason: u8,
    /// A stop-string finish's trimmed tokens were checked against the
    /// scheduler's step holding the text's last token.
    trim_checked: bool,
    /// vLLM's per-request metrics were checked against them.
    metrics_checked: bool,
    /// vLLM's per-request metrics were checked up to the scheduler's step
    /// holding a stop-string text's last token (before the scheduler's finish).
    metrics_to_stop: bool,
    t_trimmed_tokens: u16,
    /// Header step of the stream's last provenance / text record.
    p_step: Option<u64>,
    t_step: Option<u64>,
    p_src: Option<u64>,
    // (the third line)
    t_src: Option<u64>,
    /// The tokens not yet released, by offset.
    toks: tokens::TokRing,
    // --- what records and chunks queue, and `advance` proves
    recs: Fifo<PRec>,
    frags: Fifo<Frag>,
    /// (token end, HTTP byte end) of each text record the SSE has not yet
    /// passed, and of each SSE chunk not yet held against them: a chunk
    /// carries whole steps, so it ends where a text record ends.
    t_ends: Fifo<(u64, u64)>,
    q_ends: Fifo<(u64, u64)>,
    f: ByteWindow,
    h: ByteWindow,
    s: ByteWindow,
    pending_gives: Fifo<u16>,
    /// The records with drafts, in order (the fourth witness lists them).
    spec_steps: Vec<SpecStep>,
    // --- counters (settled records, spans)
    stats: Stats,
    // --- the rare and the ends of a request
    unreachable_give: Option<(u64, u16)>,
    /// The first pending token whose give count is unknown, if any.
    first_unknown_give: Option<u64>,
    sse_reason: Option<String>,
    sse_id: Option<String>,
    metrics: Option<Metrics>,
}

impl Stream {
    #[inline]
    fn open(&self) -> bool {
        !self.exact && self.failed.is_none()
    }

    /// The slot of offset `o`, which is at most one past the retained tokens.
    #[inline]
    fn slot(&mut self, o: u64) -> &mut Tok {
        self.toks.slot(o)
    }

    #[inline]
    fn tok(&self, o: u64) -> &Tok {
        self.toks.get(o)
    }

    /// Release everything once the stream has its verdict.
    fn release_all(&mut self) {
        self.toks.clear();
        self.recs.release();
        self.spec_steps = Vec::new();
        self.frags.release();
        self.pending_gives.release();
        self.t_ends.release();
        self.q_ends.release();
        self.f.clear();
        self.h.clear();
        self.s.clear();
    }
}

/// The reconciler of one client run.
pub struct Reconciler {
    run_id: [u8; 16],
    streams: Vec<Stream>,
    /// The sources, in order of their first admitted frame.
    sources: Sources,
    infos: Vec<SourceInfo>,
    events: Vec<Event>,
    counters: Counters,
    admitted: bool,
    /// `finalize()` ran: nothing changes any more.
    finalized: bool,
    /// The keyed digest of duplicates (its key is secret and random: a sender
    /// cannot craft two frames with the same digest).
    digest: FrameDigest,
    /// Index of the first event produced by the input being processed: only
    /// spans of the same input are merged, so merging never depends on drains.
    input_start: usize,
    /// The record vectors of decoded frames (kept: no allocation per frame).
    record_bufs: protocol::RecordBufs,
    /// Scratch buffer of a fragment's pieces (kept: no allocation per fragment).
    pieces: Vec<prove::Piece>,
    /// Scratch buffer of a fragment's unit byte starts (kept, like `pieces`).
    unit_starts: Vec<usize>,
    /// Packed mode: spans go here, not to `events` (None: events mode).
    packed: Option<SpanSink>,
    /// Skip `advance` after an input that cannot make it change anything
    /// (`prove.rs`, `advance_is_noop_after_*`); false only in the test that
    /// holds every skip against a reconciler that never skips.
    skip_advance: bool,
    /// `advance` calls skipped after provenance, text and SSE inputs.
    #[cfg(test)]
    skipped: [u64; 3],
    /// Of those after text and SSE, skipped while a fragment waited for
    /// bytes (`Stream::front_still_waits`).
    #[cfg(test)]
    skipped_waiting: u64,
    /// Prove a run of confirmed fragments with one three-way comparison
    /// (`prove.rs` `run_of_fragments`); false only in the test that holds it
    /// against a reconciler that proves fragment by fragment.
    prove_runs: bool,
    /// Runs proven by `run_of_fragments`, and runs whose bytes differed (for that
    /// test: the fast path and its fallback were taken).
    #[cfg(test)]
    runs_proven: [u64; 2],
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
            sources: Sources::default(),
            infos: Vec::new(),
            events: Vec::new(),
            counters: Counters::default(),
            admitted: false,
            finalized: false,
            digest: FrameDigest::new(),
            input_start: 0,
            record_bufs: protocol::RecordBufs::default(),
            pieces: Vec::new(),
            unit_starts: Vec::new(),
            packed: None,
            skip_advance: true,
            #[cfg(test)]
            skipped: [0; 3],
            #[cfg(test)]
            skipped_waiting: 0,
            prove_runs: true,
            #[cfg(test)]
            runs_proven: [0; 2],
        }
    }

    /// Packed mode from now on: spans are no longer events but
    /// [`PackedSpan`]s for [`Reconciler::take_spans_into`], merged by the same
    /// rule; every other event stays in `drain()`. For a reader that only
    /// needs where spans end and their step and role (the screen via
    /// [`crate::fed::Fed::take`]); chosen before the first input.
    pub fn pack_spans(&mut self) {
        if self.packed.is_none() {
            self.packed = Some(SpanSink::default());
        }
    }

    pub fn packs_spans(&self) -> bool {
        self.packed.is_some()
    }

    /// The spans since the previous call (packed mode; else nothing), in
    /// order; `out` is cleared first and trades buffers with the reconciler.
    pub fn take_spans_into(&mut self, out: &mut Vec<PackedSpan>) {
        out.clear();
        if let Some(sink) = &mut self.packed {
            std::mem::swap(out, &mut sink.spans);
            sink.input_start = 0;
        }
    }

    /// The start of an input: only spans of the same input merge.
    #[inline]
    pub(super) fn begin_input(&mut self) {
        self.input_start = self.events.len();
        if let Some(sink) = &mut self.packed {
            sink.input_start = sink.spans.len();
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

    // ----------------------------------------------------------------- frames

    // -------------------------------------------------------------------- SSE

    // --------------------------------------------------------------- progress

    // ---------------------------------------------------------------- queries

    /// The events since the previous call.
    pub fn drain(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// Append the events since the previous call to `out` (no allocation in
    /// steady state: an empty `out` trades buffers with the reconciler
    /// instead of copying every event, so both keep their capacity).
    pub fn drain_into(&mut self, out: &mut Vec<Event>) {
        if out.is_empty() {
            std::mem::swap(out, &mut self.events);
        } else {
            out.append(&mut self.events);
        }
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
