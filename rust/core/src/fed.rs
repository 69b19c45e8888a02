//! Everything that happens to a run's inputs, under one lock: the
//! [`Reconciler`], the `--record` [`Tap`] and what the screen still has to be
//! told.
//!
//! The receiver thread (datagrams), the HTTP thread (SSE deltas and stream
//! ends) and Python (its own pushes, and collecting) share one
//! `Arc<Mutex<Fed>>`. Each input goes to the tap and then to the reconciler
//! while the lock is held, so the recording's order is the applied order; an
//! SSE delta's text is queued for the screen in the same step, so a span can
//! never reach Python before the text it covers. [`Fed::take`] hands Python
//! one [`Batch`] per screen refresh: new text once per stream, spans packed
//! as byte ranges of that text, the other events, the streams that ended.
//!
//! Queries go straight to the reconciler (`Deref`); every input has its own
//! method here, so nothing can reach the reconciler around the tap.

use std::collections::HashMap;
use std::ops::Deref;

use crate::outcome::Outcome;
use crate::reconcile::{Event, PackedSpan, Reconciler};
use crate::record::{u32_bytes, Item};
use crate::spans::{push_span_record, span_word};
use crate::sse::inputs::{CountsKind, SseInput};
use crate::sse::Usage;
use crate::tap::Tap;

/// New SSE text of one stream since the last [`Fed::take`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StreamText {
    /// The new text, UTF-8, once.
    pub utf8: Vec<u8>,
    /// Where each non-empty delta's text ends, in bytes from the stream's start.
    pub chunk_ends: Vec<u64>,
    /// One arrival time per delta (monotonic seconds), empty-text ones included.
    pub times: Vec<f64>,
    pub tokens: u64,
    /// What the server-reported tier reads (docs/CLIENT.md, "Server-reported
    /// steps"): per delta, where its text ends (bytes from the stream's start)
    /// and how many token ids it carried...
    pub delta_ends: Vec<u64>,
    pub delta_tokens: Vec<u32>,
    /// ...each step-counts input as five i64 words: the stream's deltas so far,
    /// the [`CountsKind`] code, then its three values (-1: absent)...
    pub counts: Vec<i64>,
    /// ...and the per-step lists of each usage input that had them.
    pub lists: Vec<StepLists>,
}

/// vLLM's `per_step_accepted` and `per_step_drafted` of one usage input.
pub type StepLists = (Option<Vec<u32>>, Option<Vec<u32>>);

/// Words per step-counts input in [`StreamText::counts`].
pub const COUNTS_WORDS: usize = 5;

/// A stream whose HTTP exchange is over.
#[derive(Clone, Debug, PartialEq)]
pub struct Ended {
    pub stream: u16,
    pub outcome: Outcome,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
    /// Monotonic seconds.
    pub at: f64,
}

/// What the screen needs since the last take.
#[derive(Debug, Default)]
pub struct Batch {
    pub texts: Vec<(u16, StreamText)>,
    /// Every stream's new spans, packed ([`crate::spans::SPAN_RECORD_BYTES`] each) and
    /// grouped by stream: one buffer, so Python appends each stream's part
    /// with one `frombytes` of a slice.
    pub spans: Vec<u8>,
    /// `(stream, start, end)`: where each stream's spans are in `spans`.
    pub span_index: Vec<(u16, usize, usize)>,
    /// Every event except spans, in order.
    pub events: Vec<Event>,
    pub ends: Vec<Ended>,
}

impl Shown {
    /// Stream `stream`'s entry of the batch being built; None for a stream
    /// the run does not have.
    fn entry(&mut self, stream: u16) -> Option<&mut StreamText> {
        if stream as usize >= self.text_bytes.len() {
            return None;
        }
        let order = &mut self.order;
        Some(self.texts.entry(stream).or_insert_with(|| {
            order.push(stream);
            StreamText::default()
        }))
    }
}

#[derive(Default)]
struct Shown {
    /// Each stream's packed records of the batch being built (kept: no
    /// allocation per take once they have grown).
    span_runs: Vec<Vec<u8>>,
    texts: HashMap<u16, StreamText>,
    /// Streams of `texts` in the order they first had news.
    order: Vec<u16>,
    /// Bytes of SSE text per stream so far.
    text_bytes: Vec<u64>,
    /// Deltas per stream so far.
    deltas: Vec<u64>,
    /// Where each stream's last packed span ended.
    span_end: Vec<u64>,
    ends: Vec<Ended>,
}

/// The reconciler of a run with its tap and its queue for the screen.
pub struct Fed {
    rec: Reconciler,
    tap: Option<Tap>,
    shown: Shown,
    scratch: Vec<Event>,
    /// The packed spans of a take (kept: no allocation per take).
    packed: Vec<PackedSpan>,
}

impl Deref for Fed {
    type Target = Reconciler;
    fn deref(&self) -> &Reconciler {
        &self.rec
    }
}

/// `CLOCK_MONOTONIC` in seconds: the clock of Python's `time.monotonic()`.
pub fn monotonic() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

impl Fed {
    pub fn new(rec: Reconciler) -> Fed {
        let n = rec.num_streams() as usize;
        Fed {
            rec,
            tap: None,
            shown: Shown {
                text_bytes: vec![0; n],
                deltas: vec![0; n],
                span_end: vec![0; n],
                span_runs: vec![Vec::new(); n],
                ..Shown::default()
            },
            scratch: Vec::new(),
            packed: Vec::new(),
        }
    }

    /// A `Fed` whose reconciler packs its spans ([`Reconciler::pack_spans`]):
    /// for a caller that reads spans only through [`Fed::take`] (`drain()`
    /// then returns every other event, no span). Same batches as
    /// [`Fed::new`], with no span text built or copied.
    pub fn new_packed(mut rec: Reconciler) -> Fed {
        rec.pack_spans();
        Fed::new(rec)
    }

    // ------------------------------------------------------------- the tap

    /// Record every input from now on (replacing no tap: one per run).
    pub fn set_tap(&mut self, tap: Tap) {
        self.tap = Some(tap);
    }

    pub fn take_tap(&mut self) -> Option<Tap> {
        self.tap.take()
    }

    pub fn is_recording(&self) -> bool {
        self.tap.is_some()
    }

    fn tap_item(&mut self, at: f64, item: &Item<'_>) {
        if let Some(tap) = &mut self.tap {
            tap.item(at, item);
        }
    }

    // -------------------------------------------------------------- inputs
    pub fn push_frame(&mut self, data: &[u8]) {
        if let Some(tap) = &mut self.tap {
            tap.item(monotonic(), &Item::Frame(data));
        }
        self.rec.push_frame(data);
    }

    pub fn push_frame_at(&mut self, data: &[u8], at: f64) {
        self.tap_item(at, &Item::Frame(data));
        self.rec.push_frame(data);
    }

    pub fn push_frames<'a>(&mut self, frames: impl IntoIterator<Item = &'a [u8]>) {
        let at = if self.tap.is_some() { monotonic() } else { 0.0 };
        for f in frames {
            self.push_frame_at(f, at);
        }
    }

    /// A datagram rejected before decoding (e.g. oversized).
    pub fn reject(&mut self, reason: String) {
        let at = if self.tap.is_some() { monotonic() } else { 0.0 };
        self.reject_at(reason, at);
    }

    pub fn reject_at(&mut self, reason: String, at: f64) {
        self.tap_item(at, &Item::Reject(&reason));
        self.rec.reject(reason);
    }

    /// Telemetry lost between the server and this client (see
    /// [`Reconciler::push_lost`]): recorded, then every stream without a
    /// verdict fails.
    pub fn push_lost(&mut self, frames: Option<u64>) {
        let at = if self.tap.is_some() { monotonic() } else { 0.0 };
        self.push_lost_at(frames, at);
    }

    pub fn push_lost_at(&mut self, frames: Option<u64>, at: f64) {
        self.tap_item(at, &Item::Lost { frames });
        self.rec.push_lost(frames);
    }

    /// An SSE delta pushed by the caller (not queued for the screen: that
    /// caller keeps its own text).
    pub fn push_sse(&mut self, stream: u16, text: &str, token_ids: &[u32]) {
        if let Some(tap) = &mut self.tap {
            tap.sse(monotonic(), stream, text, token_ids);
        }
        self.rec.push_sse(stream, text, token_ids);
    }

    /// A chunk id (the first chunk's, and whenever it changes).
    pub fn push_sse_id(&mut self, stream: u16, id: &str) {
        let at = self.now();
        self.sse_id_at(stream, id, at);
    }

    fn sse_id_at(&mut self, stream: u16, id: &str, at: f64) {
        self.tap_item(at, &Item::SseId { stream, id });
        self.rec.push_sse_id(stream, id);
    }

    /// A choice other than the single choice 0.
    pub fn push_sse_choice(&mut self, stream: u16, index: u32) {
        let at = self.now();
        self.sse_choice_at(stream, index, at);
    }

    fn sse_choice_at(&mut self, stream: u16, index: u32, at: f64) {
        self.tap_item(at, &Item::SseChoice { stream, index });
        self.rec.push_sse_choice(stream, index);
    }

    /// The usage: `completion_tokens` and vLLM's per-step lists.
    pub fn push_sse_usage(
        &mut self,
        stream: u16,
        completion_tokens: Option<u64>,
        accepted: Option<&[u32]>,
        drafted: Option<&[u32]>,
    ) {
        let at = self.now();
        self.sse_usage_at(stream, completion_tokens, accepted, drafted, at);
    }

    fn sse_usage_at(
        &mut self,
        stream: u16,
        completion_tokens: Option<u64>,
        accepted: Option<&[u32]>,
        drafted: Option<&[u32]>,
        at: f64,
    ) {
        if let Some(tap) = &mut self.tap {
            let (a, d) = (accepted.map(u32_bytes), drafted.map(u32_bytes));
            let item = Item::SseUsage {
                stream,
                completion_tokens,
                accepted: a.as_deref(),
                drafted: d.as_deref(),
            };
            tap.item(at, &item);
        }
        self.rec
            .push_sse_usage(stream, completion_tokens, accepted, drafted);
    }

    /// The stream's SSE ended normally with choice 0's last finish_reason.
    pub fn finish_sse(&mut self, stream: u16, reason: Option<&str>) {
        let at = self.now();
        self.finish_at(stream, reason, at);
    }

    fn finish_at(&mut self, stream: u16, reason: Option<&str>, at: f64) {
        self.tap_item(at, &Item::Finish { stream, reason });
        self.rec.finish_sse(stream, reason);
    }

    /// The time of an input pushed now (only read while recording).
    fn now(&self) -> f64 {
        if self.tap.is_some() {
            monotonic()
        } else {
            0.0
        }
    }

    pub fn finalize(&mut self) {
        if let Some(tap) = &mut self.tap {
            tap.item(monotonic(), &Item::Finalize);
        }
        self.rec.finalize();
    }

    pub fn drain(&mut self) -> Vec<Event> {
        self.rec.drain()
    }

    pub fn drain_into(&mut self, out: &mut Vec<Event>) {
        self.rec.drain_into(out);
    }

    // ----------------------------------------- the HTTP thread's inputs

    /// A stream's request began.
    pub fn stream_started(&mut self, stream: u16, at: f64) {
        self.tap_item(at, &Item::Start { stream });
    }

    /// One SSE delta read by the HTTP thread: recorded, reconciled and queued
    /// for the screen.
    pub fn sse_delta(&mut self, stream: u16, text: &str, token_ids: &[u32], at: f64) {
        if let Some(tap) = &mut self.tap {
            tap.sse(at, stream, text, token_ids);
        }
        self.rec.push_sse(stream, text, token_ids);
        let s = stream as usize;
        let shown = &mut self.shown;
        let (Some(bytes), Some(deltas)) = (shown.text_bytes.get_mut(s), shown.deltas.get_mut(s))
        else {
            return;
        };
        *bytes += text.len() as u64;
        *deltas += 1;
        let end = *bytes;
        let Some(entry) = shown.entry(stream) else {
            return;
        };
        entry.times.push(at);
        entry.tokens += token_ids.len() as u64;
        if !text.is_empty() {
            entry.utf8.extend_from_slice(text.as_bytes());
            entry.chunk_ends.push(end);
        }
        entry.delta_ends.push(end);
        entry.delta_tokens.push(token_ids.len() as u32);
    }

    /// One SSE input read by the HTTP thread: a delta goes to the screen as
    /// well ([`Fed::sse_delta`]); the others are recorded and reconciled.
    pub fn sse_input(&mut self, stream: u16, input: &SseInput, at: f64) {
        match input {
            SseInput::Delta { text, token_ids } => self.sse_delta(stream, text, token_ids, at),
            SseInput::Id(id) => self.sse_id_at(stream, id, at),
            SseInput::Choice(index) => self.sse_choice_at(stream, *index, at),
            SseInput::Usage {
                completion_tokens,
                per_step_accepted,
                per_step_drafted,
            } => {
                self.sse_usage_at(
                    stream,
                    *completion_tokens,
                    per_step_accepted.as_deref(),
                    per_step_drafted.as_deref(),
                    at,
                );
                if per_step_accepted.is_some() || per_step_drafted.is_some() {
                    if let Some(entry) = self.shown.entry(stream) {
                        let lists = (per_step_accepted.clone(), per_step_drafted.clone());
                        entry.lists.push(lists);
                    }
                }
            }
            SseInput::Counts { kind, values } => self.sse_counts_at(stream, *kind, *values, at),
            SseInput::Frame(frame) => self.push_frame_at(frame, at),
            SseInput::Lost(reason) => self.push_stream_lost_at(stream, reason, at),
        }
    }

    /// Step counters of a stock server: recorded and queued for the screen
    /// (the server-reported tier); the reconciler never sees them.
    pub fn push_sse_counts(&mut self, stream: u16, kind: CountsKind, values: [Option<u64>; 3]) {
        let at = self.now();
        self.sse_counts_at(stream, kind, values, at);
    }

    fn sse_counts_at(&mut self, stream: u16, kind: CountsKind, values: [Option<u64>; 3], at: f64) {
        let item = Item::SseCounts {
            stream,
            kind: kind.code(),
            values,
        };
        self.tap_item(at, &item);
        let Some(deltas) = self.shown.deltas.get(stream as usize).copied() else {
            return;
        };
        if let Some(entry) = self.shown.entry(stream) {
            entry.counts.push(deltas as i64);
            entry.counts.push(i64::from(kind.code()));
            // A count beyond i64 is stated as absent rather than wrapped (no server counts that far).
            entry
                .counts
                .extend(values.map(|v| v.and_then(|n| i64::try_from(n).ok()).unwrap_or(-1)));
        }
    }

    /// A stream's in-band telemetry is missing frames (see
    /// [`Reconciler::push_stream_lost`]): recorded, then that stream fails.
    pub fn push_stream_lost(&mut self, stream: u16, reason: &str) {
        let at = if self.tap.is_some() { monotonic() } else { 0.0 };
        self.push_stream_lost_at(stream, reason, at);
    }

    pub fn push_stream_lost_at(&mut self, stream: u16, reason: &str, at: f64) {
        self.tap_item(at, &Item::StreamLost { stream, reason });
        self.rec.push_stream_lost(stream, reason);
    }

    /// A stream's exchange is over: a normal end finishes its SSE in the
    /// reconciler (with the finish reason), any other end is recorded as such.
    pub fn stream_ended(&mut self, ended: Ended) {
        match ended.outcome.kind {
            None => self.finish_at(ended.stream, ended.finish_reason.as_deref(), ended.at),
            Some(kind) => self.tap_item(
                ended.at,
                &Item::End {
                    stream: ended.stream,
                    code: kind.code(),
                    status: ended.outcome.status,
                    detail: &ended.outcome.detail,
                },
            ),
        }
        self.shown.ends.push(ended);
    }

    // ------------------------------------------------------------ output

    /// Everything the screen needs since the last call.
    pub fn take(&mut self) -> Batch {
        let mut batch = Batch::default();
        let shown = &mut self.shown;
        for stream in shown.order.drain(..) {
            if let Some(text) = shown.texts.remove(&stream) {
                batch.texts.push((stream, text));
            }
        }
        batch.ends = std::mem::take(&mut shown.ends);
        self.rec.drain_into(&mut self.scratch);
        if self.rec.packs_spans() {
            // Packed mode: no event is a span.
            self.rec.take_spans_into(&mut self.packed);
            let spans = self.packed.iter().map(|p| {
                (
                    p.stream,
                    p.byte_start,
                    p.byte_end,
                    span_word(p.step, p.role),
                )
            });
            pack_spans(shown, &mut batch, spans);
            std::mem::swap(&mut batch.events, &mut self.scratch);
        } else {
            let spans = self.scratch.iter().filter_map(|event| match event {
                Event::Span {
                    stream,
                    byte_start,
                    text,
                    step,
                    role,
                    ..
                } => Some((
                    *stream,
                    *byte_start,
                    byte_start + text.len() as u64,
                    span_word(*step, *role),
                )),
                _ => None,
            });
            pack_spans(shown, &mut batch, spans);
            batch.events.extend(
                self.scratch
                    .drain(..)
                    .filter(|e| !matches!(e, Event::Span { .. })),
            );
        }
        batch
    }
}

/// Write `spans` ((stream, byte start, byte end, step/role word), in order)
/// into `batch.spans` grouped by stream, with `batch.span_index`. One pass
/// over the spans appends each stream's records to its own kept buffer (a
/// span starting beyond the stream's last end gets an uncolored gap record
/// before it), then the buffers are joined in stream order.
fn pack_spans(
    shown: &mut Shown,
    batch: &mut Batch,
    spans: impl Iterator<Item = (u16, u64, u64, u64)>,
) {
    let runs = &mut shown.span_runs;
    for (stream, byte_start, end, word) in spans {
        let s = stream as usize;
        let (Some(run), Some(last)) = (runs.get_mut(s), shown.span_end.get_mut(s)) else {
            continue;
        };
        // Spans cover the text contiguously (PROTOCOL.md); should one
        // ever start further on, the bytes between stay uncolored.
        if byte_start > *last {
            push_span_record(run, byte_start, span_word(None, None));
        }
        push_span_record(run, end, word);
        *last = (*last).max(end);
    }
    let total: usize = runs.iter().map(Vec::len).sum();
    if total == 0 {
        return;
    }
    batch.spans.reserve_exact(total);
    for (s, run) in runs.iter_mut().enumerate() {
        if !run.is_empty() {
            let start = batch.spans.len();
            batch.spans.extend_from_slice(run);
            batch.span_index.push((s as u16, start, batch.spans.len()));
            run.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::EndKind;
    use crate::spans::{unpack_spans, SPAN_RECORD_BYTES};

    /// Records grouped by stream in stream order, an uncolored gap record
    /// (its end where the next span starts, no step or role) before a span
    /// that starts beyond its stream's last end, spans of unknown streams
    /// left out, and the ends carried over to the next take.
    #[test]
    fn pack_spans_groups_by_stream_with_gap_records() {
        let mut shown = Shown {
            span_end: vec![0; 3],
            span_runs: vec![Vec::new(); 3],
            ..Shown::default()
        };
        let w = |step, role| span_word(Some(step), Some(role));
        let mut batch = Batch::default();
        let spans = [
            (2, 0, 3, w(0, 1)),
            (0, 0, 2, w(0, 0)),
            (2, 3, 5, w(1, 1)),
            (0, 4, 6, w(1, 2)),
            (7, 0, 1, w(0, 0)),
        ];
        pack_spans(&mut shown, &mut batch, spans.into_iter());
        assert_eq!(batch.span_index, vec![(0, 0, 48), (2, 48, 80)]);
        assert_eq!(
            unpack_spans(&batch.spans[..48]),
            vec![
                (2, Some(0), Some(0)),
                (4, None, None),
                (6, Some(1), Some(2))
            ]
        );
        assert_eq!(
            unpack_spans(&batch.spans[48..]),
            vec![(3, Some(0), Some(1)), (5, Some(1), Some(1))]
        );
        let mut batch = Batch::default();
        let spans = [(0, 6, 7, w(2, 3)), (1, 2, 4, w(0, 0))];
        pack_spans(&mut shown, &mut batch, spans.into_iter());
        assert_eq!(batch.span_index, vec![(0, 0, 16), (1, 16, 48)]);
        assert_eq!(
            unpack_spans(&batch.spans[..16]),
            vec![(7, Some(2), Some(3))]
        );
        assert_eq!(
            unpack_spans(&batch.spans[16..]),
            vec![(2, None, None), (4, Some(0), Some(0))]
        );
        let mut batch = Batch::default();
        pack_spans(&mut shown, &mut batch, std::iter::empty());
        assert!(batch.spans.is_empty() && batch.span_index.is_empty());
    }

    #[test]
    fn take_gives_text_once_spans_as_ranges_and_ends() {
        let mut fed = Fed::new(Reconciler::with_run_id([1; 16], 3));
        fed.stream_started(2, 1.0);
        fed.sse_delta(2, "h\u{e9}", &[5, 6], 1.5);
        fed.sse_delta(2, "", &[7], 1.6);
        fed.sse_delta(2, "!", &[8], 1.7);
        fed.stream_ended(Ended {
            stream: 2,
            outcome: Outcome::finished(),
            finish_reason: Some("stop".into()),
            usage: None,
            at: 1.8,
        });
        fed.stream_ended(Ended {
            stream: 0,
            outcome: Outcome::http(EndKind::HttpStatus, 500, "boom"),
            finish_reason: None,
            usage: None,
            at: 1.9,
        });
        let batch = fed.take();
        assert_eq!(
            batch.texts,
            vec![(
                2,
                StreamText {
                    utf8: "h\u{e9}!".as_bytes().to_vec(),
                    chunk_ends: vec![3, 4],
                    times: vec![1.5, 1.6, 1.7],
                    tokens: 4,
                    delta_ends: vec![3, 3, 4],
                    delta_tokens: vec![2, 1, 1],
                    ..StreamText::default()
                }
            )]
        );
        assert_eq!(batch.ends.len(), 2);
        assert!(batch.spans.is_empty() && batch.span_index.is_empty()); // nothing proven
        let again = fed.take();
        assert!(again.texts.is_empty() && again.ends.is_empty());
        // The next delta's chunk end continues the stream's byte count.
        fed.sse_delta(2, "ab", &[9], 2.0);
        assert_eq!(fed.take().texts[0].1.chunk_ends, vec![6]);
    }

    /// The server-reported tier's inputs reach the screen in order with the
    /// stream's delta count at each counts input; the reconciler never sees
    /// the counts (its stream stays without evidence of them).
    #[test]
    fn take_gives_the_server_reported_inputs() {
        let mut fed = Fed::new(Reconciler::with_run_id([1; 16], 2));
        let timings = |n| SseInput::Counts {
            kind: CountsKind::Timings,
            values: [Some(n), Some(3), None],
        };
        fed.sse_input(1, &timings(1), 1.0);
        fed.sse_delta(1, "ab", &[], 1.1);
        fed.sse_input(1, &timings(2), 1.1);
        let usage = SseInput::Usage {
            completion_tokens: Some(2),
            per_step_accepted: Some(vec![1]),
            per_step_drafted: None,
        };
        fed.sse_input(1, &usage, 1.2);
        // A stream the run does not have is ignored.
        fed.sse_input(9, &timings(1), 1.3);
        let batch = fed.take();
        assert_eq!(batch.texts.len(), 1);
        let (stream, text) = &batch.texts[0];
        assert_eq!(*stream, 1);
        assert_eq!(text.delta_ends, vec![2]);
        assert_eq!(text.delta_tokens, vec![0]);
        assert_eq!(text.counts, vec![0, 1, 1, 3, -1, 1, 1, 2, 3, -1]);
        assert_eq!(text.lists, vec![(Some(vec![1]), None)]);
    }

    /// The packed spans of every take, stream by stream, are the span events
    /// of the same inputs drained from a plain reconciler: ends and
    /// step/role words in order, for every batch size.
    #[test]
    fn take_packs_exactly_the_drained_spans() {
        use crate::workload::{generate, WorkloadConfig};
        for (coalesce, per_take) in [(1, 1), (1, 37), (2, 256), (1, usize::MAX)] {
            let w = generate(&WorkloadConfig {
                streams: 8,
                tokens_per_stream: 300,
                coalesce,
                seed: 7,
                ..WorkloadConfig::default()
            });
            let mut plain = Reconciler::with_run_id(w.run_id, 8);
            crate::workload::feed_inputs(&w.inputs, &mut plain);
            let mut expected = vec![Vec::new(); 8];
            for e in plain.drain() {
                if let Event::Span {
                    stream,
                    byte_start,
                    text,
                    step,
                    role,
                    ..
                } = e
                {
                    let end = byte_start + text.len() as u64;
                    expected[stream as usize].push((end, step, role));
                }
            }
            let mut fed = Fed::new(Reconciler::with_run_id(w.run_id, 8));
            let mut got = vec![Vec::new(); 8];
            let mut collect = |fed: &mut Fed| {
                let batch = fed.take();
                let mut at = 0;
                for &(s, start, end) in &batch.span_index {
                    assert_eq!(start, at, "streams' records tile the buffer");
                    at = end;
                    got[s as usize].extend(unpack_spans(&batch.spans[start..end]));
                }
                assert_eq!(at, batch.spans.len());
            };
            for (i, input) in w.inputs.iter().enumerate() {
                feed_one(&mut fed, input);
                if (i + 1) % per_take.min(w.inputs.len()) == 0 {
                    collect(&mut fed);
                }
            }
            collect(&mut fed);
            assert!(expected.iter().all(|spans| !spans.is_empty()));
            assert_eq!(
                got, expected,
                "coalesce {coalesce}, {per_take} inputs per take"
            );
        }
    }

    fn feed_one(fed: &mut Fed, input: &crate::workload::Input) {
        use crate::workload::Input;
        match input {
            Input::Frame(f) => fed.push_frame(f),
            Input::Sse {
                stream,
                text,
                token_ids,
            } => fed.push_sse(*stream, text, token_ids),
            Input::SseId { stream, id } => fed.push_sse_id(*stream, id),
            Input::FinishSse { stream, reason } => fed.finish_sse(*stream, reason.as_deref()),
        }
    }

    /// Packed mode changes how spans are built, not which: every take of
    /// the same inputs gives the same packed spans, span index and other
    /// events (in order) as events mode, for clean runs and for runs where
    /// lying SSE text, dropped frames and early finishes put failures and
    /// verdicts between spans of one input (the merge rule's edge), at every
    /// batch size; and `drain()` in packed mode gives those other events
    /// without any span.
    #[test]
    fn packed_mode_gives_the_spans_of_events_mode() {
        use crate::workload::{generate, Input, WorkloadConfig};
        let mut checked_spans = 0;
        let mut checked_failed = 0;
        for (coalesce, per_take, lie) in [
            (1, 1, 0),
            (1, 37, 0),
            (2, 256, 0),
            (1, usize::MAX, 0),
            (1, 5, 7),
            (3, 64, 11),
            (1, usize::MAX, 13),
        ] {
            for split in [false, true] {
                let w = generate(&WorkloadConfig {
                    streams: 8,
                    tokens_per_stream: 300,
                    coalesce,
                    seed: 11,
                    ..WorkloadConfig::default()
                });
                let mut inputs = w.inputs.clone();
                if split {
                    // Each delta as two, cut at the middle character: a step's
                    // spans come from two inputs (they must not merge).
                    inputs = crate::workload::split_deltas(inputs);
                }
                if lie > 0 {
                    let mut n = 0;
                    let lost_after = inputs.len() * 3 / 4;
                    inputs.retain_mut(|input| {
                        n += 1;
                        match input {
                            // A lying SSE delta: one more character.
                            Input::Sse { text, .. } if n % (lie * 3) == 0 => text.push('x'),
                            // A lost frame, late in the run.
                            Input::Frame(_) if n > lost_after && n % (lie * 5) == 1 => {
                                return false
                            }
                            _ => {}
                        }
                        true
                    });
                    // A stream whose SSE ends early.
                    inputs.insert(
                        inputs.len() / 2,
                        Input::FinishSse {
                            stream: 3,
                            reason: Some("stop".into()),
                        },
                    );
                }
                let mut plain = Fed::new(Reconciler::with_run_id(w.run_id, 8));
                let mut packed = Fed::new_packed(Reconciler::with_run_id(w.run_id, 8));
                assert!(packed.packs_spans() && !plain.packs_spans());
                let per_take = per_take.min(inputs.len());
                let mut compare = |plain: &mut Fed, packed: &mut Fed| {
                    let (a, b) = (plain.take(), packed.take());
                    assert_eq!(a.spans, b.spans, "coalesce {coalesce}, per take {per_take}");
                    assert_eq!(a.span_index, b.span_index);
                    assert_eq!(a.events, b.events);
                    assert!(a.events.iter().all(|e| !matches!(e, Event::Span { .. })));
                    checked_spans += a.spans.len() / SPAN_RECORD_BYTES;
                    checked_failed += a
                        .events
                        .iter()
                        .filter(|e| matches!(e, Event::Failed { .. }))
                        .count();
                };
                for (i, input) in inputs.iter().enumerate() {
                    feed_one(&mut plain, input);
                    feed_one(&mut packed, input);
                    if (i + 1) % per_take == 0 {
                        compare(&mut plain, &mut packed);
                    }
                }
                plain.finalize();
                packed.finalize();
                compare(&mut plain, &mut packed);
                // drain() in packed mode: the other events, no span.
                let mut plain = Reconciler::with_run_id(w.run_id, 8);
                let mut packed = Reconciler::with_run_id(w.run_id, 8);
                packed.pack_spans();
                for input in &inputs {
                    crate::workload::feed_inputs(std::slice::from_ref(input), &mut plain);
                    crate::workload::feed_inputs(std::slice::from_ref(input), &mut packed);
                }
                let others: Vec<Event> = plain
                    .drain()
                    .into_iter()
                    .filter(|e| !matches!(e, Event::Span { .. }))
                    .collect();
                assert_eq!(packed.drain(), others);
            }
        }
        // The lies made failures, and spans were compared.
        assert!(
            checked_spans > 1_000 && checked_failed >= 8,
            "{checked_spans} spans, {checked_failed} failures"
        );
    }
}
