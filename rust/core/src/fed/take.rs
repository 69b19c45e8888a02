//! [`Fed::take`]: the batch the screen gets per refresh: new text once per
//! stream, the spans packed as byte ranges of that text, the other events,
//! the streams that ended.

use super::{Batch, Fed, Shown};
use crate::reconcile::Event;
use crate::spans::{push_span_record, span_word};

impl Fed {
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
pub(super) fn pack_spans(
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
