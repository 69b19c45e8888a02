//! `parallelhue._native`: the PyO3 bindings of `parallelhue-core`.
//!
//! The Python API of `Reconciler` is exactly the one of docs/PROTOCOL.md
//! ("Python-facing API"), shared with `parallelhue.reference.Reconciler`.
//! Batch entry points release the GIL (`py.detach`); single small calls do not.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use parallelhue_core::describe::frame_meaning;
use parallelhue_core::http::{BodyDecoder, BodyError, Framing};
use parallelhue_core::protocol;
use parallelhue_core::reconcile::{self as core, ArgError, Event, Verdict};
use parallelhue_core::sse::{self, SseError, SseEvent};
#[cfg(unix)]
use parallelhue_core::sse_reader;
use parallelhue_core::sse_stream::StreamEnd;
use parallelhue_core::stats::{Stats, STAT_KEYS};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple,
};
use serde_json::Value;
use std::time::Duration;

fn value_error(e: impl ToString) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// Python's `str()` of an object, for messages.
fn repr_str(obj: &Bound<'_, PyAny>) -> String {
    obj.str()
        .map(|s| s.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The three-witness reconciler of one run (docs/PROTOCOL.md "Reconciliation").
#[pyclass(module = "parallelhue._native", frozen)]
struct Reconciler {
    inner: Arc<Mutex<core::Reconciler>>,
    num_streams: u16,
}

impl Reconciler {
    fn lock(&self) -> PyResult<MutexGuard<'_, core::Reconciler>> {
        self.inner
            .lock()
            .map_err(|_| PyRuntimeError::new_err("reconciler poisoned by a panic"))
    }

    fn stream(&self, stream: &Bound<'_, PyAny>) -> PyResult<u16> {
        let bad = || ArgError::Stream {
            stream: repr_str(stream),
            n: self.num_streams,
        };
        let s: i64 = stream.extract().map_err(|_| value_error(bad()))?;
        if s < 0 || s >= i64::from(self.num_streams) {
            return Err(value_error(bad()));
        }
        Ok(s as u16)
    }

    /// Convert `push_inputs`' items into `out` up to the first bad one, whose
    /// error is returned (the items before it stay in `out`).
    fn convert_inputs(&self, inputs: &Bound<'_, PyAny>, out: &mut Inputs) -> PyResult<()> {
        if let Ok(list) = inputs.cast::<PyList>() {
            out.items.reserve(list.len());
            for item in list.iter() {
                self.convert_input(&item, out)?;
            }
            return Ok(());
        }
        for item in inputs.try_iter()? {
            self.convert_input(&item?, out)?;
        }
        Ok(())
    }

    fn convert_input(&self, item: &Bound<'_, PyAny>, out: &mut Inputs) -> PyResult<()> {
        let Ok(tuple) = item.cast::<PyTuple>() else {
            return Err(bad_input(item));
        };
        let n = tuple.len();
        if n == 0 {
            return Err(bad_input(item));
        }
        let kind = tuple.get_item(0)?;
        let Ok(kind) = kind.cast::<PyString>() else {
            return Err(bad_input(item));
        };
        match (kind.to_str()?, n) {
            ("frame", 2) => {
                let data = frame_bytes(&tuple.get_item(1)?)?;
                let start = out.frames.len();
                out.frames.extend_from_slice(data.as_bytes());
                out.items.push(Input::Frame(start..out.frames.len()));
            }
            ("sse", 4) => {
                let stream = self.stream(&tuple.get_item(1)?)?;
                let text = tuple.get_item(2)?;
                let ids_start = out.ids.len();
                let text = text.cast::<PyString>()?.to_str()?;
                let result = token_ids_into(&tuple.get_item(3)?, &mut out.ids);
                if let Err(e) = result {
                    out.ids.truncate(ids_start);
                    return Err(e);
                }
                let text_start = out.text.len();
                out.text.push_str(text);
                out.items.push(Input::Sse {
                    stream,
                    text: text_start..out.text.len(),
                    ids: ids_start..out.ids.len(),
                });
            }
            ("finish", 2) => {
                let stream = self.stream(&tuple.get_item(1)?)?;
                out.items.push(Input::Finish(stream));
            }
            _ => return Err(bad_input(item)),
        }
        Ok(())
    }
}

/// The datagram as `bytes`: `bytes` itself, or `bytes(obj)` for any other
/// bytes-like object (as the reference reconciler does).
fn frame_bytes<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.clone());
    }
    let py = obj.py();
    Ok(py
        .get_type::<PyBytes>()
        .call1((obj,))?
        .cast_into::<PyBytes>()?)
}

fn token_ids(list: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    let mut out = Vec::new();
    token_ids_into(list, &mut out)?;
    Ok(out)
}

fn token_id(item: &Bound<'_, PyAny>) -> PyResult<u32> {
    match item.extract::<u32>() {
        Ok(v) => Ok(v),
        Err(_) => {
            // Only ints get the range message; other types a TypeError.
            item.cast::<PyInt>()?;
            Err(value_error(ArgError::TokenId(repr_str(item))))
        }
    }
}

/// Append the token ids of `list` (any iterable of ints; a list is read directly).
fn token_ids_into(list: &Bound<'_, PyAny>, out: &mut Vec<u32>) -> PyResult<()> {
    if let Ok(l) = list.cast::<PyList>() {
        out.reserve(l.len());
        for item in l.iter() {
            out.push(token_id(&item)?);
        }
        return Ok(());
    }
    for item in list.try_iter()? {
        out.push(token_id(&item?)?);
    }
    Ok(())
}

/// One item of `push_inputs`, converted while holding the GIL; the ranges
/// index the batch's shared buffers.
enum Input {
    Frame(Range<usize>),
    Sse {
        stream: u16,
        text: Range<usize>,
        ids: Range<usize>,
    },
    Finish(u16),
}

/// A `push_inputs` batch as owned Rust values (no Python object inside).
#[derive(Default)]
struct Inputs {
    items: Vec<Input>,
    frames: Vec<u8>,
    text: String,
    ids: Vec<u32>,
}

fn bad_input(item: &Bound<'_, PyAny>) -> PyErr {
    let shown = item
        .repr()
        .map(|s| s.to_string())
        .unwrap_or_else(|_| "?".into());
    value_error(format!(
        "invalid input {shown}: expected (\"frame\", bytes), \
         (\"sse\", stream, text, token_ids) or (\"finish\", stream)"
    ))
}

fn stats_dict<'py>(py: Python<'py>, s: &Stats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let hist = PyDict::new(py);
    for (k, n) in s.hist_items() {
        hist.set_item(k, n)?;
    }
    let values = [
        s.tokens,
        s.steps,
        0,
        s.drafts_scheduled,
        s.drafts_padded,
        s.plain,
        s.accepted,
        s.target,
        s.bonus,
        s.surplus_tokens,
        s.surplus_accepted,
        s.surplus_target,
        s.surplus_bonus,
        s.surplus_plain,
        s.mixed_spans,
        s.bytes,
    ];
    for (key, v) in STAT_KEYS.iter().zip(values) {
        if *key == "hist" {
            d.set_item(key, &hist)?;
        } else {
            d.set_item(key, v)?;
        }
    }
    Ok(d)
}

/// One event as its Python tuple (kinds interned; ints and text converted once).
fn event_tuple<'py>(py: Python<'py>, e: Event) -> PyResult<Bound<'py, PyAny>> {
    Ok(match e {
        Event::Span {
            stream,
            byte_start,
            text,
            step,
            first_offset,
            n_tokens,
        } => (
            intern!(py, "span"),
            stream,
            byte_start,
            PyString::new(py, &text),
            step,
            first_offset,
            n_tokens,
        )
            .into_pyobject(py)?
            .into_any(),
        Event::Exact { stream } => (intern!(py, "exact"), stream).into_pyobject(py)?.into_any(),
        Event::Failed { stream, reason } => (intern!(py, "failed"), stream, reason)
            .into_pyobject(py)?
            .into_any(),
        Event::Run { message } => (intern!(py, "run"), message).into_pyobject(py)?.into_any(),
    })
}

#[pymethods]
impl Reconciler {
    #[new]
    fn new(run_id: &Bound<'_, PyAny>, num_streams: &Bound<'_, PyAny>) -> PyResult<Self> {
        let run = match run_id.cast::<PyString>() {
            Ok(s) => s.to_string(),
            Err(_) => return Err(value_error(ArgError::RunId(repr_str(run_id)))),
        };
        let n: u32 = match num_streams.extract::<i64>() {
            Ok(n) if (1..=i64::from(core::MAX_STREAMS)).contains(&n) => n as u32,
            _ => return Err(value_error(ArgError::NumStreams(repr_str(num_streams)))),
        };
        let r = core::Reconciler::new(&run, n).map_err(value_error)?;
        Ok(Reconciler {
            inner: Arc::new(Mutex::new(r)),
            num_streams: n as u16,
        })
    }

    /// Push one datagram (already uid-checked).
    fn push_frame(&self, frame: &Bound<'_, PyAny>) -> PyResult<()> {
        let data = frame_bytes(frame)?;
        self.lock()?.push_frame(data.as_bytes());
        Ok(())
    }

    /// Push several datagrams; the GIL is released meanwhile.
    fn push_frames(&self, py: Python<'_>, frames: &Bound<'_, PyAny>) -> PyResult<()> {
        let items: Vec<Bound<'_, PyBytes>> = frames
            .try_iter()?
            .map(|f| frame_bytes(&f?))
            .collect::<PyResult<_>>()?;
        let slices: Vec<&[u8]> = items.iter().map(|b| b.as_bytes()).collect();
        let inner = &self.inner;
        py.detach(|| match inner.lock() {
            Ok(mut r) => {
                for s in &slices {
                    r.push_frame(s);
                }
                Ok(())
            }
            Err(_) => Err("reconciler poisoned by a panic"),
        })
        .map_err(PyRuntimeError::new_err)
    }

    /// One SSE delta of one stream: the choice's text and its token_ids.
    fn push_sse(
        &self,
        stream: &Bound<'_, PyAny>,
        text: &str,
        token_ids: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let s = self.stream(stream)?;
        let ids = self::token_ids(token_ids)?;
        self.lock()?.push_sse(s, text, &ids);
        Ok(())
    }

    /// Several inputs, in order: `("frame", bytes)`, `("sse", stream, text,
    /// token_ids)` or `("finish", stream)`, exactly as the single calls. The
    /// list is converted while holding the GIL, then pushed with the GIL
    /// released; a bad item raises the single call's error after the items
    /// before it were applied.
    fn push_inputs(&self, py: Python<'_>, inputs: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut batch = Inputs::default();
        let error = self.convert_inputs(inputs, &mut batch).err();
        if !batch.items.is_empty() {
            let inner = &self.inner;
            let batch = &batch;
            py.detach(|| match inner.lock() {
                Ok(mut r) => {
                    for item in &batch.items {
                        match item {
                            Input::Frame(range) => r.push_frame(&batch.frames[range.clone()]),
                            Input::Sse { stream, text, ids } => r.push_sse(
                                *stream,
                                &batch.text[text.clone()],
                                &batch.ids[ids.clone()],
                            ),
                            Input::Finish(stream) => r.finish_sse(*stream),
                        }
                    }
                    Ok(())
                }
                Err(_) => Err("reconciler poisoned by a panic"),
            })
            .map_err(PyRuntimeError::new_err)?;
        }
        match error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The stream's SSE ended normally.
    fn finish_sse(&self, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        let s = self.stream(stream)?;
        self.lock()?.finish_sse(s);
        Ok(())
    }

    /// Every stream that is not yet exact gets its verdict.
    fn finalize(&self) -> PyResult<()> {
        self.lock()?.finalize();
        Ok(())
    }

    /// The events since the previous call, in order.
    fn drain<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = self.lock()?.drain();
        let tuples = events
            .into_iter()
            .map(|e| event_tuple(py, e))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, tuples)
    }

    fn stream_stats<'py>(
        &self,
        py: Python<'py>,
        stream: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let s = self.stream(stream)?;
        let stats = self.lock()?.stream_stats(s).clone();
        stats_dict(py, &stats)
    }

    fn totals<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.lock()?.totals();
        stats_dict(py, &stats)
    }

    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.lock()?.counters().clone();
        let d = PyDict::new(py);
        for (k, v) in c.items() {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    fn sources<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let infos = self.lock()?.sources().to_vec();
        let list = PyList::empty(py);
        for s in infos {
            let d = PyDict::new(py);
            d.set_item("source_id", s.source_id)?;
            d.set_item("role", s.role_name())?;
            d.set_item("engine", s.engine_name())?;
            d.set_item("role_derivation", s.role_derivation_name())?;
            d.set_item("async_scheduling", s.hello.async_scheduling)?;
            d.set_item("num_speculative_tokens", s.hello.num_speculative_tokens)?;
            d.set_item("plugin_version", &s.hello.plugin_version)?;
            d.set_item("engine_version", &s.hello.engine_version)?;
            d.set_item("spec_method", &s.hello.spec_method)?;
            list.append(d)?;
        }
        Ok(list)
    }

    fn verdict(&self, stream: &Bound<'_, PyAny>) -> PyResult<(&'static str, Option<String>)> {
        let s = self.stream(stream)?;
        Ok(match self.lock()?.verdict(s) {
            Verdict::Pending => ("pending", None),
            Verdict::Exact => ("exact", None),
            Verdict::Failed(r) => ("failed", Some(r)),
        })
    }

    fn __repr__(&self) -> PyResult<String> {
        let r = self.lock()?;
        Ok(format!(
            "<parallelhue._native.Reconciler run {} streams {}>",
            core::run_id_hex(r.run_id()),
            r.num_streams()
        ))
    }
}

fn json_to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else {
                PyFloat::new(py, n.as_f64().unwrap_or(f64::NAN)).into_any()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(a) => {
            let list = PyList::empty(py);
            for x in a {
                list.append(json_to_py(py, x)?)?;
            }
            list.into_any()
        }
        Value::Object(m) => {
            let d = PyDict::new(py);
            for (k, x) in m {
                d.set_item(k, json_to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}

/// Decode one datagram into the vectors' decoded-meaning dict; raises
/// ValueError with the protocol's exact decoder message.
#[pyfunction]
fn decode_frame<'py>(py: Python<'py>, frame: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let data: &[u8] = if let Ok(b) = frame.cast::<PyBytes>() {
        b.as_bytes()
    } else if let Ok(b) = frame.cast::<PyByteArray>() {
        // Copy: a bytearray may change under us.
        let owned = b.to_vec();
        return match protocol::decode(&owned) {
            Ok(f) => json_to_py(py, &frame_meaning(&f)),
            Err(e) => Err(value_error(e)),
        };
    } else {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "decode_frame expects bytes",
        ));
    };
    match protocol::decode(data) {
        Ok(f) => json_to_py(py, &frame_meaning(&f)),
        Err(e) => Err(value_error(e)),
    }
}

fn sse_event_dict<'py>(
    py: Python<'py>,
    e: Result<SseEvent, SseError>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    match e {
        Ok(SseEvent::Done) => d.set_item("kind", "done")?,
        Ok(SseEvent::Other { event, data }) => {
            d.set_item("kind", "other")?;
            d.set_item("event", event)?;
            d.set_item("data", data)?;
        }
        Err(err) => {
            d.set_item("kind", "error")?;
            d.set_item("message", err.to_string())?;
        }
        Ok(SseEvent::Chunk(c)) => {
            d.set_item("kind", "chunk")?;
            d.set_item("id", c.id)?;
            let choices = PyList::empty(py);
            for ch in c.choices {
                let cd = PyDict::new(py);
                cd.set_item("index", ch.index)?;
                cd.set_item("text", ch.text)?;
                cd.set_item("token_ids", ch.token_ids)?;
                cd.set_item("finish_reason", ch.finish_reason)?;
                choices.append(cd)?;
            }
            d.set_item("choices", choices)?;
            match c.usage {
                None => d.set_item("usage", py.None())?,
                Some(u) => d.set_item("usage", usage_dict(py, &u)?)?,
            }
        }
    }
    Ok(d)
}

/// Incremental parser of an OpenAI chat/completions SSE body.
#[pyclass(module = "parallelhue._native")]
struct SseParser {
    inner: sse::SseParser,
}

#[pymethods]
impl SseParser {
    #[new]
    fn new() -> Self {
        SseParser {
            inner: sse::SseParser::new(),
        }
    }

    /// Feed body bytes (split anywhere); returns the events they complete.
    fn feed<'py>(&mut self, py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyList>> {
        let events = self.inner.feed(data);
        let list = PyList::empty(py);
        for e in events {
            list.append(sse_event_dict(py, e)?)?;
        }
        Ok(list)
    }

    /// The body ended: reports an unterminated event as an error.
    fn finish<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = self.inner.finish();
        let list = PyList::empty(py);
        for e in events {
            list.append(sse_event_dict(py, e)?)?;
        }
        Ok(list)
    }
}

fn usage_dict<'py>(py: Python<'py>, u: &sse::Usage) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("prompt_tokens", u.prompt_tokens)?;
    d.set_item("completion_tokens", u.completion_tokens)?;
    d.set_item("total_tokens", u.total_tokens)?;
    Ok(d)
}

fn parse_framing(framing: &str, length: Option<u64>) -> PyResult<Framing> {
    match (framing, length) {
        ("chunked", None) => Ok(Framing::Chunked),
        ("length", Some(n)) => Ok(Framing::Length(n)),
        ("close", None) => Ok(Framing::Close),
        _ => Err(value_error(format!(
            "framing must be 'chunked', 'close' or 'length' with a length, got {framing:?} with {length:?}"
        ))),
    }
}

/// An HTTP/1.1 response body decoder: chunked, Content-Length or
/// close-delimited (rust/core/src/http.rs).
#[pyclass(module = "parallelhue._native")]
struct HttpBody {
    inner: BodyDecoder,
}

#[pymethods]
impl HttpBody {
    #[new]
    #[pyo3(signature = (framing, length = None))]
    fn new(framing: &str, length: Option<u64>) -> PyResult<Self> {
        Ok(HttpBody {
            inner: BodyDecoder::new(parse_framing(framing, length)?),
        })
    }

    /// Bytes from the connection; returns the body bytes they hold. Raises
    /// ValueError when the framing is broken.
    fn feed<'py>(&mut self, py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        let mut out = Vec::with_capacity(data.len());
        self.inner.feed(data, &mut out).map_err(value_error)?;
        Ok(PyBytes::new(py, &out))
    }

    /// The connection closed; raises ValueError if the body was cut short.
    fn close(&mut self) -> PyResult<()> {
        self.inner.finish().map_err(value_error)
    }

    /// The whole body was read.
    #[getter]
    fn complete(&self) -> bool {
        self.inner.is_complete()
    }
}

/// The SSE reading thread (rust/core/src/sse_reader.rs): reads the handed-over
/// connections without the GIL, pushes their deltas into `reconciler`.
#[cfg(unix)]
#[pyclass(module = "parallelhue._native", frozen)]
struct SseReader {
    inner: Mutex<sse_reader::SseReader>,
    /// Checks stream indices exactly as the reconciler's own calls do.
    reconciler: Option<Py<Reconciler>>,
}

#[cfg(unix)]
impl SseReader {
    fn lock(&self) -> PyResult<MutexGuard<'_, sse_reader::SseReader>> {
        self.inner
            .lock()
            .map_err(|_| PyRuntimeError::new_err("SSE reader poisoned"))
    }
}

#[cfg(unix)]
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

#[cfg(unix)]
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

/// The telemetry socket: binds `path` (AF_UNIX datagram, mode 0600,
/// SO_PASSCRED) and pushes every datagram from this uid into `reconciler`
/// from a Rust thread that never takes the GIL.
#[pyclass(module = "parallelhue._native", frozen)]
struct Receiver {
    inner: Mutex<parallelhue_core::receiver::Receiver>,
    path: PathBuf,
}

#[pymethods]
impl Receiver {
    #[new]
    #[pyo3(signature = (path, reconciler, rcvbuf = 8 << 20))]
    fn new(path: PathBuf, reconciler: &Bound<'_, Reconciler>, rcvbuf: usize) -> PyResult<Self> {
        let sink = Arc::clone(&reconciler.get().inner);
        let rx = parallelhue_core::receiver::Receiver::bind(&path, rcvbuf, sink)?;
        Ok(Receiver {
            inner: Mutex::new(rx),
            path,
        })
    }

    /// The socket path.
    #[getter]
    fn path(&self) -> String {
        self.path.to_string_lossy().into_owned()
    }

    /// Stop the thread (after it pushed what was already queued), close the
    /// socket and unlink its path. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| match self.inner.lock() {
            Ok(mut rx) => rx.close(),
            Err(_) => Ok(()),
        })?;
        Ok(())
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.lock().map(|r| r.is_closed()).unwrap_or(true)
    }

    /// Counters: datagrams, bytes, rejected_uid, oversized, batches, errors, rcvbuf.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = self
            .inner
            .lock()
            .map_err(|_| PyRuntimeError::new_err("receiver poisoned"))?
            .stats();
        let d = PyDict::new(py);
        d.set_item("datagrams", st.received)?;
        d.set_item("bytes", st.bytes)?;
        d.set_item("rejected_uid", st.rejected_uid)?;
        d.set_item("oversized", st.oversized)?;
        d.set_item("batches", st.batches)?;
        d.set_item("errors", st.errors)?;
        d.set_item("rcvbuf", st.rcvbuf)?;
        Ok(d)
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }
}

/// The native half of ParallelHue (see docs/PROTOCOL.md).
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("PROTOCOL_VERSION", protocol::PROTOCOL_VERSION)?;
    m.add("MAX_FRAME_BYTES", protocol::MAX_FRAME_BYTES)?;
    m.add("REORDER_WINDOW", parallelhue_core::sequence::REORDER_WINDOW)?;
    m.add_class::<Reconciler>()?;
    m.add_class::<SseParser>()?;
    m.add_class::<HttpBody>()?;
    #[cfg(unix)]
    m.add_class::<SseReader>()?;
    #[cfg(unix)]
    m.add(
        "SSE_READ_INTERVAL",
        sse_reader::DEFAULT_MIN_INTERVAL.as_secs_f64(),
    )?;
    #[cfg(unix)]
    m.add("SSE_COALESCE_STREAMS", sse_reader::COALESCE_STREAMS)?;
    m.add_class::<Receiver>()?;
    m.add_function(wrap_pyfunction!(decode_frame, m)?)?;
    Ok(())
}
