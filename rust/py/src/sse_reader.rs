//! `SseReader`: the SSE reading thread.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use parallelhue_core::http::BodyError;
use parallelhue_core::sse_reader;
use parallelhue_core::sse_stream::StreamEnd;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::convert::value_error;
use crate::http::parse_framing;
use crate::reconciler::Reconciler;
use crate::sse::usage_dict;

/// The SSE reading thread (rust/core/src/sse_reader.rs): reads the handed-over
/// connections without the GIL, pushes their deltas into `reconciler`.
#[pyclass(module = "parallelhue._native", frozen)]
pub(crate) struct SseReader {
    inner: Mutex<sse_reader::SseReader>,
    /// Checks stream indices exactly as the reconciler's own calls do.
    reconciler: Option<Py<Reconciler>>,
}

impl SseReader {
    fn lock(&self) -> PyResult<MutexGuard<'_, sse_reader::SseReader>> {
        self.inner
            .lock()
            .map_err(|_| PyRuntimeError::new_err("SSE reader poisoned"))
    }
}

fn read_end(end: &sse_reader::ReadEnd) -> (&'static str, Option<String>) {
    use sse_reader::ReadEnd;
    match end {
        ReadEnd::Body(StreamEnd::Done) => ("done", None),
        ReadEnd::Body(StreamEnd::BodyEnded) => ("eof", None),
        ReadEnd::Body(StreamEnd::BadEvent(m)) => ("error", Some(m.clone())),
        ReadEnd::Body(StreamEnd::Framing(e @ BodyError::Incomplete { .. })) => {
            ("cut", Some(e.to_string()))
        }
        ReadEnd::Body(StreamEnd::Framing(e)) => ("framing", Some(e.to_string())),
        ReadEnd::Timeout => ("timeout", None),
        ReadEnd::Io(m) => ("io", Some(m.clone())),
    }
}

#[pymethods]
impl SseReader {
    #[new]
    #[pyo3(signature = (reconciler = None, min_interval = None))]
    fn new(
        reconciler: Option<&Bound<'_, Reconciler>>,
        min_interval: Option<f64>,
    ) -> PyResult<Self> {
        let min_interval = match min_interval {
            None => sse_reader::DEFAULT_MIN_INTERVAL,
            Some(t) if (0.0..=1.0).contains(&t) => Duration::from_secs_f64(t),
            Some(t) => {
                return Err(value_error(format!(
                    "min_interval must be between 0 and 1 s, got {t}"
                )))
            }
        };
        let sink = reconciler.map(|r| Arc::clone(&r.get().inner));
        let inner = sse_reader::SseReader::start(sink, min_interval)?;
        Ok(SseReader {
            inner: Mutex::new(inner),
            reconciler: reconciler.map(|r| r.clone().unbind()),
        })
    }

    /// Read `stream` from `fd`, which the reader owns from now on (-1: the
    /// connection already closed). `initial`: body bytes read with the head.
    #[pyo3(signature = (stream, fd, framing, length, initial, timeout))]
    fn add(
        &self,
        stream: &Bound<'_, PyAny>,
        fd: i32,
        framing: &str,
        length: Option<u64>,
        initial: &[u8],
        timeout: Option<f64>,
    ) -> PyResult<()> {
        let framing = parse_framing(framing, length)?;
        let stream = match &self.reconciler {
            Some(r) => r.get().stream(stream)?,
            None => stream.extract::<u16>()?,
        };
        let timeout = match timeout {
            None => None,
            Some(t) if t > 0.0 && t.is_finite() => Some(Duration::from_secs_f64(t)),
            Some(t) => return Err(value_error(format!("timeout must be positive, got {t}"))),
        };
        self.lock()?
            .add(stream, fd, framing, initial.to_vec(), timeout);
        Ok(())
    }

    /// Stop reading `stream` and close its descriptor.
    fn remove(&self, stream: u16) -> PyResult<()> {
        self.lock()?.remove(stream);
        Ok(())
    }

    /// `(reads, finished)` since the last call: reads are `(stream, texts,
    /// times, tokens, text_bytes)`, finished are `(stream, end, message,
    /// finish_reason, usage)`.
    fn take<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let (reads, finished) = self.lock()?.take();
        let out_reads = PyList::empty(py);
        for (stream, read) in reads {
            out_reads.append((stream, read.texts, read.times, read.tokens, read.bytes))?;
        }
        let out_finished = PyList::empty(py);
        for f in finished {
            let (end, message) = read_end(&f.end);
            let usage = f.usage.as_ref().map(|u| usage_dict(py, u)).transpose()?;
            out_finished.append((f.stream, end, message, f.finish_reason, usage))?;
        }
        PyTuple::new(py, [out_reads.into_any(), out_finished.into_any()])
    }

    /// Stop the thread and close every descriptor it holds. Idempotent.
    fn close(&self, py: Python<'_>) {
        py.detach(|| {
            if let Ok(mut r) = self.inner.lock() {
                r.close();
            }
        });
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.lock().map(|r| r.is_closed()).unwrap_or(true)
    }

    /// The thread died (a bug): the streams it held will never finish.
    #[getter]
    fn failed(&self) -> bool {
        self.inner.lock().map(|r| r.has_failed()).unwrap_or(true)
    }
}
