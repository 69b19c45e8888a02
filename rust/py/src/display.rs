//! The run's output for the screen, packed (`Reconciler.take`), inputs as
//! one packed buffer (`Reconciler.push_recorded`), and the `--record` tap.
//!
//! `take` replaces a Python tuple per event by a few `bytes`: each stream's
//! new SSE text once; its new spans (16 bytes a span, `spans::SPAN_RECORD_BYTES`)
//! go straight onto the stream's `SpanRecords`.

use std::path::PathBuf;

use parallelhue_core::fed::{monotonic, Batch};
use parallelhue_core::record::{self, Item};
use parallelhue_core::sse::inputs::CountsKind;
use parallelhue_core::tap::Tap;
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::convert::value_error;
use crate::reconciler::{event_tuple, Reconciler};
use crate::spans::SpanRecords;
use crate::streams::usage_dict;

fn le_bytes<T: Copy, const N: usize>(values: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * N);
    for v in values {
        out.extend_from_slice(&f(*v));
    }
    out
}

fn batch_tuple<'py>(
    py: Python<'py>,
    batch: Batch,
    stores: &[Bound<'py, SpanRecords>],
) -> PyResult<Bound<'py, PyTuple>> {
    let texts = PyList::empty(py);
    for (stream, t) in batch.texts {
        // The server-reported tier's inputs (docs/CLIENT.md).
        let lists = PyList::empty(py);
        for (accepted, drafted) in &t.lists {
            lists.append((accepted.clone(), drafted.clone()))?;
        }
        let reported = (
            PyBytes::new(py, &le_bytes(&t.delta_ends, u64::to_le_bytes)),
            PyBytes::new(py, &le_bytes(&t.delta_tokens, u32::to_le_bytes)),
            PyBytes::new(py, &le_bytes(&t.counts, i64::to_le_bytes)),
            lists,
        );
        texts.append((
            stream,
            PyBytes::new(py, &t.utf8),
            PyBytes::new(py, &le_bytes(&t.chunk_ends, u64::to_le_bytes)),
            PyBytes::new(py, &le_bytes(&t.times, f64::to_le_bytes)),
            t.tokens,
            reported,
        ))?;
    }
    // Each stream's new spans go straight onto its records: no Python object
    // and no Python call per stream (see spans.rs).
    for (stream, start, end) in batch.span_index {
        if let Some(store) = stores.get(usize::from(stream)) {
            store
                .borrow_mut()
                .records
                .append_packed(&batch.spans[start..end]);
        }
    }
    let events = PyList::empty(py);
    for e in batch.events {
        events.append(event_tuple(py, e)?)?;
    }
    let ends = PyList::empty(py);
    for e in batch.ends {
        let usage = e.usage.as_ref().map(|u| usage_dict(py, u)).transpose()?;
        ends.append((
            e.stream,
            e.outcome.kind.map(|k| k.name()),
            e.outcome.status,
            e.outcome.detail,
            e.finish_reason,
            usage,
            e.at,
        ))?;
    }
    PyTuple::new(py, [texts.into_any(), events.into_any(), ends.into_any()])
}

/// One `SpanRecords` per stream, checked before anything is taken (so a
/// wrong argument loses nothing).
fn span_stores<'py>(
    span_records: &Bound<'py, PyAny>,
    num_streams: u16,
) -> PyResult<Vec<Bound<'py, SpanRecords>>> {
    let n = span_records.len()?;
    if n != usize::from(num_streams) {
        return Err(value_error(format!(
            "take(): span_records has {n} entries; the reconciler has {num_streams} streams"
        )));
    }
    (0..n)
        .map(|i| {
            span_records
                .get_item(i)?
                .cast_into::<SpanRecords>()
                .map_err(|_| {
                    PyTypeError::new_err(format!(
                        "take(): span_records[{i}] is not a parallelhue._native.SpanRecords"
                    ))
                })
        })
        .collect()
}

#[pymethods]
impl Reconciler {
    /// `(texts, events, ends)` since the last call, each stream's new spans
    /// appended to `span_records[stream]` (see the stub).
    fn take<'py>(
        &self,
        py: Python<'py>,
        span_records: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let stores = span_stores(span_records, self.num_streams)?;
        let inner = &self.inner;
        let batch = py
            .detach(|| inner.lock().map(|mut fed| fed.take()).map_err(|_| ()))
            .map_err(|_| PyRuntimeError::new_err("reconciler poisoned by a panic"))?;
        batch_tuple(py, batch, &stores)
    }

    /// Apply a buffer of recording items (no preamble) in order: SSE deltas,
    /// finishes, frames, rejections, losses, finalize; starts, ends, header and
    /// footer carry nothing for the reconciler. The GIL is released; an
    /// invalid item raises ValueError after the items before it.
    fn push_recorded(&self, py: Python<'_>, data: &[u8]) -> PyResult<()> {
        let inner = &self.inner;
        let n = self.num_streams;
        let result = py.detach(|| {
            let Ok(mut fed) = inner.lock() else {
                return Err("reconciler poisoned by a panic");
            };
            let mut ids = Vec::new();
            let decoded = record::decode_items(data, |_, item| match item {
                Item::Sse {
                    stream,
                    text,
                    ids: raw,
                } if stream < n => {
                    ids.clear();
                    ids.extend(Item::token_ids(raw));
                    fed.push_sse(stream, text, &ids);
                }
                Item::SseId { stream, id } if stream < n => fed.push_sse_id(stream, id),
                Item::SseChoice { stream, index } if stream < n => {
                    fed.push_sse_choice(stream, index)
                }
                Item::SseUsage {
                    stream,
                    completion_tokens,
                    accepted,
                    drafted,
                } if stream < n => {
                    let list = |raw: Option<&[u8]>| raw.map(|b| Item::token_ids(b).collect());
                    let (a, d): (Option<Vec<u32>>, Option<Vec<u32>>) =
                        (list(accepted), list(drafted));
                    fed.push_sse_usage(stream, completion_tokens, a.as_deref(), d.as_deref());
                }
                Item::SseCounts {
                    stream,
                    kind,
                    values,
                } if stream < n => {
                    if let Some(kind) = CountsKind::from_code(kind) {
                        fed.push_sse_counts(stream, kind, values);
                    }
                }
                Item::Finish { stream, reason } if stream < n => fed.finish_sse(stream, reason),
                Item::Frame(frame) => fed.push_frame(frame),
                Item::Reject(reason) => fed.reject(reason.to_owned()),
                Item::Lost { frames } => fed.push_lost(frames),
                Item::StreamLost { stream, reason } if stream < n => {
                    fed.push_stream_lost(stream, reason)
                }
                Item::Finalize => fed.finalize(),
                _ => {}
            });
            Ok(decoded)
        });
        match result {
            Err(message) => Err(PyRuntimeError::new_err(message)),
            Ok(Err(e)) => Err(value_error(e)),
            Ok(Ok(())) => Ok(()),
        }
    }

    /// Start recording every input to `path` (gzip'd recording format 3)
    /// after `header` (a JSON object). OSError if the file cannot be created.
    fn record(&self, path: PathBuf, header: &str) -> PyResult<()> {
        let tap = Tap::create(&path, header, monotonic())?;
        let mut fed = self.lock()?;
        if fed.is_recording() {
            return Err(value_error("this reconciler is already recording"));
        }
        fed.set_tap(tap);
        Ok(())
    }

    /// Write `footer` (a JSON object; None for an interrupted run) and close
    /// the recording; OSError with the first write error. No-op when not
    /// recording.
    #[pyo3(signature = (footer = None))]
    fn close_record(&self, py: Python<'_>, footer: Option<&str>) -> PyResult<()> {
        let Some(tap) = self.lock()?.take_tap() else {
            return Ok(());
        };
        py.detach(|| tap.close(monotonic(), footer))?;
        Ok(())
    }

    #[getter]
    fn recording(&self) -> PyResult<bool> {
        Ok(self.lock()?.is_recording())
    }
}
