//! `Reconciler`: the binding of `parallelhue_core::reconcile::Reconciler`,
//! held in the run's `Fed` (tap and screen queue under the same lock; the
//! packed screen output and the tap's controls are in `display.rs`).

use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use parallelhue_core::fed::Fed;
use parallelhue_core::reconcile::{self as core, ArgError, Event, Verdict};
use parallelhue_core::stats::{Stats, STAT_KEYS};
use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::convert::{
    completion_tokens, frame_bytes, repr_str, step_counts, token_ids_into, value_error,
};

/// The three-witness reconciler of one run (docs/PROTOCOL.md "Reconciliation").
#[pyclass(module = "parallelhue._native", frozen)]
pub(crate) struct Reconciler {
    pub(crate) inner: Arc<Mutex<Fed>>,
    pub(crate) num_streams: u16,
}

impl Reconciler {
    pub(crate) fn lock(&self) -> PyResult<MutexGuard<'_, Fed>> {
        self.inner
            .lock()
            .map_err(|_| PyRuntimeError::new_err("reconciler poisoned by a panic"))
    }

    pub(crate) fn stream(&self, stream: &Bound<'_, PyAny>) -> PyResult<u16> {
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
            ("sse_id", 3) => {
                let stream = self.stream(&tuple.get_item(1)?)?;
                let id = tuple.get_item(2)?;
                let id = id.cast::<PyString>()?.to_str()?;
                let start = out.text.len();
                out.text.push_str(id);
                out.items.push(Input::SseId {
                    stream,
                    id: start..out.text.len(),
                });
            }
            ("sse_choice", 3) => {
                let stream = self.stream(&tuple.get_item(1)?)?;
                let index = choice_index(&tuple.get_item(2)?)?;
                out.items.push(Input::SseChoice { stream, index });
            }
            ("sse_usage", 5) => {
                let stream = self.stream(&tuple.get_item(1)?)?;
                let n = completion_tokens(&tuple.get_item(2)?)?;
                let mut list = |i: usize| -> PyResult<Option<Range<usize>>> {
                    let value = tuple.get_item(i)?;
                    let start = out.ids.len();
                    match step_counts(&value)? {
                        None => Ok(None),
                        Some(counts) => {
                            out.ids.extend(counts);
                            Ok(Some(start..out.ids.len()))
                        }
                    }
                };
                let accepted = list(3)?;
                let drafted = list(4)?;
                out.items.push(Input::SseUsage {
                    stream,
                    completion_tokens: n,
                    accepted,
                    drafted,
                });
            }
            ("finish", 3) => {
                let stream = self.stream(&tuple.get_item(1)?)?;
                let reason = tuple.get_item(2)?;
                let reason = if reason.is_none() {
                    None
                } else {
                    let start = out.text.len();
                    out.text.push_str(reason.cast::<PyString>()?.to_str()?);
                    Some(start..out.text.len())
                };
                out.items.push(Input::Finish { stream, reason });
            }
            _ => return Err(bad_input(item)),
        }
        Ok(())
    }
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
    SseId {
        stream: u16,
        id: Range<usize>,
    },
    SseChoice {
        stream: u16,
        index: u32,
    },
    SseUsage {
        stream: u16,
        completion_tokens: Option<u64>,
        accepted: Option<Range<usize>>,
        drafted: Option<Range<usize>>,
    },
    Finish {
        stream: u16,
        reason: Option<Range<usize>>,
    },
}

impl Inputs {
    /// Push every converted item into the core reconciler, in order.
    fn apply(&self, r: &mut Fed) {
        let ids = |range: &Option<Range<usize>>| range.clone().map(|x| &self.ids[x]);
        for item in &self.items {
            match item {
                Input::Frame(range) => r.push_frame(&self.frames[range.clone()]),
                Input::Sse { stream, text, ids } => {
                    r.push_sse(*stream, &self.text[text.clone()], &self.ids[ids.clone()])
                }
                Input::SseId { stream, id } => r.push_sse_id(*stream, &self.text[id.clone()]),
                Input::SseChoice { stream, index } => r.push_sse_choice(*stream, *index),
                Input::SseUsage {
                    stream,
                    completion_tokens,
                    accepted,
                    drafted,
                } => r.push_sse_usage(*stream, *completion_tokens, ids(accepted), ids(drafted)),
                Input::Finish { stream, reason } => {
                    r.finish_sse(*stream, reason.clone().map(|x| &self.text[x]))
                }
            }
        }
    }
}

/// A `push_inputs` batch as owned Rust values (no Python object inside).
#[derive(Default)]
struct Inputs {
    items: Vec<Input>,
    frames: Vec<u8>,
    text: String,
    ids: Vec<u32>,
}

/// The item shapes `push_inputs` (and `pack_inputs`) take, as its error names them.
pub(crate) const INPUT_SHAPES: &str = "(\"frame\", bytes), \
     (\"sse\", stream, text, token_ids), (\"sse_id\", stream, id), \
     (\"sse_choice\", stream, index), (\"sse_usage\", stream, completion_tokens, \
     per_step_accepted, per_step_drafted) or (\"finish\", stream, finish_reason)";

fn bad_input(item: &Bound<'_, PyAny>) -> PyErr {
    let shown = item
        .repr()
        .map(|s| s.to_string())
        .unwrap_or_else(|_| "?".into());
    value_error(format!("invalid input {shown}: expected {INPUT_SHAPES}"))
}

/// A choice index: an int in 0..=u32::MAX (ValueError otherwise, TypeError
/// for another type).
fn choice_index(index: &Bound<'_, PyAny>) -> PyResult<u32> {
    match index.extract::<u32>() {
        Ok(v) => Ok(v),
        Err(_) => {
            index.cast::<pyo3::types::PyInt>()?;
            Err(value_error(ArgError::ChoiceIndex(repr_str(index))))
        }
    }
}

fn list_u64<'py>(py: Python<'py>, values: &[u64]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, values)
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
        0,
        0,
        s.metrics_steps,
    ];
    for (key, v) in STAT_KEYS.iter().zip(values) {
        match *key {
            "hist" => d.set_item(key, &hist)?,
            "drafts_by_pos" => d.set_item(key, list_u64(py, &s.drafts_by_pos)?)?,
            "accepted_by_pos" => d.set_item(key, list_u64(py, &s.accepted_by_pos)?)?,
            _ => d.set_item(key, v)?,
        }
    }
    Ok(d)
}

/// One event as its Python tuple (kinds interned; ints and text converted once).
pub(crate) fn event_tuple<'py>(py: Python<'py>, e: Event) -> PyResult<Bound<'py, PyAny>> {
    Ok(match e {
        Event::Span {
            stream,
            byte_start,
            text,
            step,
            first_offset,
            n_tokens,
            role,
        } => (
            intern!(py, "span"),
            stream,
            byte_start,
            PyString::new(py, &text),
            step,
            first_offset,
            n_tokens,
            role,
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
    #[pyo3(signature = (run_id, num_streams, *, packed_spans = false))]
    fn new(
        run_id: &Bound<'_, PyAny>,
        num_streams: &Bound<'_, PyAny>,
        packed_spans: bool,
    ) -> PyResult<Self> {
        let run = match run_id.cast::<PyString>() {
            Ok(s) => s.to_string(),
            Err(_) => return Err(value_error(ArgError::RunId(repr_str(run_id)))),
        };
        let n: u32 = match num_streams.extract::<i64>() {
            Ok(n) if (1..=i64::from(core::MAX_STREAMS)).contains(&n) => n as u32,
            _ => return Err(value_error(ArgError::NumStreams(repr_str(num_streams)))),
        };
        let r = core::Reconciler::new(&run, n).map_err(value_error)?;
        // Packed: spans only through take(), built without their text.
        let fed = if packed_spans {
            Fed::new_packed(r)
        } else {
            Fed::new(r)
        };
        Ok(Reconciler {
            inner: Arc::new(Mutex::new(fed)),
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
        let ids = crate::convert::token_ids(token_ids)?;
        self.lock()?.push_sse(s, text, &ids);
        Ok(())
    }

    /// Several inputs, in order, exactly as the single calls: `("frame",
    /// bytes)`, `("sse", stream, text, token_ids)`, `("sse_id", stream, id)`,
    /// `("sse_choice", stream, index)`, `("sse_usage", stream,
    /// completion_tokens, per_step_accepted, per_step_drafted)` or `("finish",
    /// stream, finish_reason)`. The list is converted while holding the GIL,
    /// then pushed with the GIL released; a bad item raises the single call's
    /// error after the items before it were applied.
    fn push_inputs(&self, py: Python<'_>, inputs: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut batch = Inputs::default();
        let error = self.convert_inputs(inputs, &mut batch).err();
        if !batch.items.is_empty() {
            let inner = &self.inner;
            let batch = &batch;
            py.detach(|| match inner.lock() {
                Ok(mut r) => {
                    batch.apply(&mut r);
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

    /// Telemetry lost between the server and this client: `frames` the
    /// server's hub discarded, None an unknown number (the telemetry stream
    /// ended before the run). Every stream without a final verdict fails.
    #[pyo3(signature = (frames))]
    fn push_lost(&self, frames: &Bound<'_, PyAny>) -> PyResult<()> {
        let count = if frames.is_none() {
            None
        } else {
            match frames.extract::<u64>() {
                Ok(n) if !frames.is_instance_of::<PyBool>() => Some(n),
                _ => {
                    return Err(value_error(format!(
                        "lost frame count {} out of range 0..=18446744073709551615",
                        repr_str(frames)
                    )))
                }
            }
        };
        self.lock()?.push_lost(count);
        Ok(())
    }

    /// The SSE chunk `id` of a stream (its first chunk's, and every one that
    /// differs from the previous chunk's).
    fn push_sse_id(&self, stream: &Bound<'_, PyAny>, chunk_id: &str) -> PyResult<()> {
        let s = self.stream(stream)?;
        self.lock()?.push_sse_id(s, chunk_id);
        Ok(())
    }

    /// A stream's in-band telemetry is missing frames (its response said so,
    /// or ended before its telemetry did): that stream fails with `reason`.
    fn push_stream_lost(&self, stream: &Bound<'_, PyAny>, reason: &str) -> PyResult<()> {
        let s = self.stream(stream)?;
        self.lock()?.push_stream_lost(s, reason);
        Ok(())
    }

    /// The stream's chunks carried a choice other than the single choice 0.
    fn push_sse_choice(&self, stream: &Bound<'_, PyAny>, index: &Bound<'_, PyAny>) -> PyResult<()> {
        let s = self.stream(stream)?;
        let index = choice_index(index)?;
        self.lock()?.push_sse_choice(s, index);
        Ok(())
    }

    /// The usage chunk: `usage.completion_tokens` and vLLM's per-request
    /// speculative metrics (`per_step_accepted`, `per_step_drafted`).
    fn push_sse_usage(
        &self,
        stream: &Bound<'_, PyAny>,
        completion_tokens: &Bound<'_, PyAny>,
        per_step_accepted: &Bound<'_, PyAny>,
        per_step_drafted: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let s = self.stream(stream)?;
        let n = crate::convert::completion_tokens(completion_tokens)?;
        let accepted = step_counts(per_step_accepted)?;
        let drafted = step_counts(per_step_drafted)?;
        self.lock()?
            .push_sse_usage(s, n, accepted.as_deref(), drafted.as_deref());
        Ok(())
    }

    /// The stream's SSE ended normally; `finish_reason` is the last non-null
    /// `finish_reason` of its choice 0.
    fn finish_sse(&self, stream: &Bound<'_, PyAny>, finish_reason: Option<&str>) -> PyResult<()> {
        let s = self.stream(stream)?;
        self.lock()?.finish_sse(s, finish_reason);
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
            d.set_item("verification", s.verification_name())?;
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
