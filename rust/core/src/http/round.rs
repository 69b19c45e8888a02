//! A round's news handed to the run under one lock: each exchange's start,
//! its SSE inputs (copied into buffers reused every round), its end; the
//! telemetry stream's items and end (through [`crate::telemetry::link`]).

use std::ops::Range;

use super::exchange::Exchange;
use super::thread::Thread;
use crate::fed::{monotonic, Ended, Fed};
use crate::outcome::Outcome;
use crate::sse_inputs::{SseInput, SseInputRef};
use crate::telemetry::link::TelemetryEnd;

/// One SSE input of a stream read in this round, with its arrival time.
struct Delta {
    input: Pending,
    time: f64,
}

/// A delta's text and token ids are copied into the exchange's round
/// buffers (reused every round: no allocation per chunk); the rare other
/// inputs are kept as they are.
enum Pending {
    Delta {
        text: Range<usize>,
        token_ids: Range<usize>,
    },
    Other(SseInput),
}

/// The SSE inputs of one exchange read since the last publish.
#[derive(Default)]
pub(super) struct RoundInputs {
    deltas: Vec<Delta>,
    text: String,
    token_ids: Vec<u32>,
}

impl RoundInputs {
    pub(super) fn push(&mut self, input: SseInputRef<'_>, time: f64) {
        let input = match input {
            SseInputRef::Delta { text, token_ids } => {
                let t = self.text.len();
                let i = self.token_ids.len();
                self.text.push_str(text);
                self.token_ids.extend_from_slice(token_ids);
                Pending::Delta {
                    text: t..self.text.len(),
                    token_ids: i..self.token_ids.len(),
                }
            }
            other => Pending::Other(other.to_owned()),
        };
        self.deltas.push(Delta { input, time });
    }

    pub(super) fn is_empty(&self) -> bool {
        self.deltas.is_empty()
    }

    /// Hand them to `fed` in order, and empty the buffers (keeping them).
    pub(super) fn publish(&mut self, fed: &mut Fed, stream: u16) {
        for d in self.deltas.drain(..) {
            match d.input {
                Pending::Delta { text, token_ids } => {
                    fed.sse_delta(stream, &self.text[text], &self.token_ids[token_ids], d.time)
                }
                Pending::Other(input) => fed.sse_input(stream, &input, d.time),
            }
        }
        self.text.clear();
        self.token_ids.clear();
    }
}

impl Thread<'_> {
    /// Hand the round's starts, deltas and ends (and telemetry) to the run (one lock).
    pub(super) fn publish(
        &mut self,
        exchanges: &mut Vec<Exchange>,
        mut stops: Vec<(u16, Outcome)>,
    ) {
        // The telemetry exchange's items and end move to the link first.
        for ex in exchanges.iter_mut().filter(|ex| ex.telemetry) {
            ex.start_at = None;
            self.link.items.append(&mut ex.items);
            if let Some(outcome) = ex.end.take() {
                ex.sock = None;
                ex.tls = None;
                self.link.end = Some(match ex.tbody.as_mut().and_then(|b| b.end.take()) {
                    Some(body_end) => TelemetryEnd::Body(body_end),
                    None => TelemetryEnd::Exchange(outcome),
                });
                ex.done = true;
            }
        }
        let link = &self.link;
        let telemetry_news = !link.items.is_empty() || link.end.is_some() || link.accept;
        let busy = exchanges
            .iter()
            .any(|ex| ex.start_at.is_some() || !ex.deltas.is_empty() || ex.end.is_some());
        if !busy && stops.is_empty() && !telemetry_news {
            exchanges.retain(|ex| !ex.done);
            return;
        }
        let mut fed = self.fed.lock().unwrap_or_else(|poisoned| {
            // The reconciler panicked under another caller: nothing it says
            // can be trusted any more, so this thread stops (the client then
            // fails every unfinished stream).
            drop(poisoned);
            panic!("the run's reconciler failed")
        });
        let time = monotonic();
        if telemetry_news {
            self.link.publish(self.telemetry, &mut fed, time);
        }
        for ex in exchanges.iter_mut() {
            if let Some(at) = ex.start_at.take() {
                fed.stream_started(ex.stream, at);
            }
            if ex.end.is_none() && !ex.telemetry {
                if let Some(i) = stops.iter().position(|(s, _)| *s == ex.stream) {
                    let (_, outcome) = stops.swap_remove(i);
                    ex.fail(outcome);
                }
            }
            ex.deltas.publish(&mut fed, ex.stream);
            if let Some(outcome) = ex.end.take() {
                ex.sock = None;
                ex.tls = None;
                let (finish_reason, usage) = match &ex.body {
                    Some(b) => (b.finish_reason.clone(), b.usage.clone()),
                    None => (None, None),
                };
                fed.stream_ended(Ended {
                    stream: ex.stream,
                    outcome,
                    finish_reason,
                    usage,
                    at: time,
                });
                ex.done = true;
            }
        }
        exchanges.retain(|ex| !ex.done);
        // Stops of streams whose exchange is already over.
        for (stream, outcome) in stops {
            fed.stream_ended(Ended {
                stream,
                outcome,
                finish_reason: None,
                usage: None,
                at: time,
            });
        }
    }
}
