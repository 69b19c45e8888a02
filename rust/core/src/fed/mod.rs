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

mod take;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::ops::Deref;

use crate::outcome::Outcome;
use crate::reconcile::{Event, PackedSpan, Reconciler};
use crate::record::{u32_bytes, Item};
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
}
