//! One exchange's SSE inputs of a round, copied into buffers reused every
//! round (no allocation per chunk) until the thread publishes them.

use std::ops::Range;

use crate::fed::Fed;
use crate::sse::inputs::{SseInput, SseInputRef};

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
