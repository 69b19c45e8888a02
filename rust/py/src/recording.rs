//! The recording format from Python: `RecordWriter` (the reference path's
//! recording), `decode_recording` (for `replay`) and `encode_recording`
//! (`record.write_recording`); the test kit's `pack_inputs` encodes with
//! [`encode_input`] too.

use std::path::PathBuf;

use parallelhue_core::fed::monotonic;
use parallelhue_core::outcome::{EndKind, END_KINDS};
use parallelhue_core::record::{self, Item};
use parallelhue_core::sse::inputs::CountsKind;
use parallelhue_core::tap::Tap;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

use crate::convert::{frame_bytes, token_ids_into, value_error};

fn item_tuple<'py>(py: Python<'py>, t: f64, item: Item<'_>) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(Some(match item {
        Item::Start { stream } => (t, "start", stream).into_pyobject(py)?.into_any(),
        Item::Sse { stream, text, ids } => {
            let ids: Vec<u32> = Item::token_ids(ids).collect();
            (t, "sse", stream, text, ids).into_pyobject(py)?.into_any()
        }
        Item::SseId { stream, id } => (t, "sse_id", stream, id).into_pyobject(py)?.into_any(),
        Item::SseChoice { stream, index } => (t, "sse_choice", stream, index)
            .into_pyobject(py)?
            .into_any(),
        Item::SseUsage {
            stream,
            completion_tokens,
            accepted,
            drafted,
        } => {
            let list = |raw: Option<&[u8]>| raw.map(|b| Item::token_ids(b).collect::<Vec<u32>>());
            (
                t,
                "sse_usage",
                stream,
                completion_tokens,
                list(accepted),
                list(drafted),
            )
                .into_pyobject(py)?
                .into_any()
        }
        Item::Finish { stream, reason } => {
            (t, "finish", stream, reason).into_pyobject(py)?.into_any()
        }
        Item::End {
            stream,
            code,
            status,
            detail,
        } => {
            let name = EndKind::from_code(code).map_or("internal", EndKind::name);
            (t, "end", stream, name, status, detail)
                .into_pyobject(py)?
                .into_any()
        }
        Item::Frame(data) => (t, "frame", PyBytes::new(py, data))
            .into_pyobject(py)?
            .into_any(),
        Item::SseCounts {
            stream,
            kind,
            values: [a, b, c],
        } => {
            // decode_items accepts known kinds only.
            let name = CountsKind::from_code(kind).map_or("?", CountsKind::name);
            (t, "sse_counts", stream, name, a, b, c)
                .into_pyobject(py)?
                .into_any()
        }
        Item::Reject(reason) => (t, "reject", reason).into_pyobject(py)?.into_any(),
        Item::Lost { frames } => (t, "lost", frames).into_pyobject(py)?.into_any(),
        Item::StreamLost { stream, reason } => (t, "stream_lost", stream, reason)
            .into_pyobject(py)?
            .into_any(),
        Item::Finalize => PyTuple::new(
            py,
            [
                t.into_pyobject(py)?.into_any(),
                PyString::new(py, "finalize").into_any(),
            ],
        )?
        .into_any(),
        Item::Header(_) | Item::Footer(_) => return Ok(None),
    }))
}

/// `(header, items, footer)` of a decompressed recording: the header and
/// footer JSON text (footer None for an interrupted run) and the items as
/// tuples `(time, kind, ...)`. ValueError names what is wrong.
#[pyfunction]
pub(crate) fn decode_recording<'py>(
    py: Python<'py>,
    data: &[u8],
) -> PyResult<(String, Bound<'py, PyList>, Option<String>)> {
    let body = record::check_preamble(data).map_err(value_error)?;
    let items = PyList::empty(py);
    let mut header: Option<String> = None;
    let mut footer: Option<String> = None;
    let mut failed: Option<PyErr> = None;
    let decoded = record::decode_items(body, |t, item| {
        if failed.is_some() {
            return;
        }
        match item {
            Item::Header(h) => header = Some(h.to_owned()),
            Item::Footer(f) => footer = Some(f.to_owned()),
            other => match item_tuple(py, t, other) {
                Ok(Some(tuple)) => {
                    if let Err(e) = items.append(tuple) {
                        failed = Some(e);
                    }
                }
                Ok(None) => {}
                Err(e) => failed = Some(e),
            },
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    decoded.map_err(value_error)?;
    let header = header.ok_or_else(|| value_error("the recording has no header"))?;
    Ok((header, items, footer))
}

/// Optional per-step counts as little-endian u32s (None stays None).
fn counts_bytes(value: &Bound<'_, PyAny>) -> PyResult<Option<Vec<u8>>> {
    if value.is_none() {
        return Ok(None);
    }
    let mut ids = Vec::new();
    token_ids_into(value, &mut ids)?;
    Ok(Some(record::u32_bytes(&ids)))
}

/// One reconciler input item (as `push_inputs` and `encode_recording` take
/// them, without the time) appended as a recording item at time `t`; false
/// for another kind or shape.
pub(crate) fn encode_input(
    out: &mut Vec<u8>,
    t: f64,
    kind: &str,
    f: &[Bound<'_, PyAny>],
) -> PyResult<bool> {
    match (kind, f.len()) {
        ("frame", 1) => {
            let data = frame_bytes(&f[0])?;
            record::encode_item(out, t, &Item::Frame(data.as_bytes()));
        }
        ("sse", 3) => {
            let mut ids = Vec::new();
            token_ids_into(&f[2], &mut ids)?;
            let text: String = f[1].extract()?;
            record::encode_sse(out, t, f[0].extract()?, &text, &ids);
        }
        ("sse_id", 2) => {
            let id: String = f[1].extract()?;
            let stream = f[0].extract()?;
            record::encode_item(out, t, &Item::SseId { stream, id: &id });
        }
        ("sse_choice", 2) => {
            let (stream, index) = (f[0].extract()?, f[1].extract()?);
            record::encode_item(out, t, &Item::SseChoice { stream, index });
        }
        ("sse_usage", 4) => {
            let (accepted, drafted) = (counts_bytes(&f[2])?, counts_bytes(&f[3])?);
            let item = Item::SseUsage {
                stream: f[0].extract()?,
                completion_tokens: f[1].extract()?,
                accepted: accepted.as_deref(),
                drafted: drafted.as_deref(),
            };
            record::encode_item(out, t, &item);
        }
        ("sse_counts", 5) => {
            let kind: String = f[1].extract()?;
            let item = Item::SseCounts {
                stream: f[0].extract()?,
                kind: counts_kind(&kind)?.code(),
                values: [f[2].extract()?, f[3].extract()?, f[4].extract()?],
            };
            record::encode_item(out, t, &item);
        }
        ("finish", 2) => {
            let reason: Option<String> = f[1].extract()?;
            let stream = f[0].extract()?;
            let item = Item::Finish {
                stream,
                reason: reason.as_deref(),
            };
            record::encode_item(out, t, &item);
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// The recording of a run whose inputs Python feeds (the reference path):
/// the same format and writer as the Rust tap; each call records one item at
/// the current time.
#[pyclass(module = "parallelhue._native")]
pub(crate) struct RecordWriter {
    tap: Option<Tap>,
}

impl RecordWriter {
    fn tap(&mut self) -> PyResult<&mut Tap> {
        self.tap
            .as_mut()
            .ok_or_else(|| value_error("the recording is closed"))
    }

    fn put(&mut self, item: &Item<'_>) -> PyResult<()> {
        self.tap()?.item(monotonic(), item);
        Ok(())
    }
}

fn counts_kind(name: &str) -> PyResult<CountsKind> {
    CountsKind::from_name(name)
        .ok_or_else(|| value_error(format!("unknown counts kind {name:?}: timings or spec")))
}

fn end_code(kind: &str) -> PyResult<u8> {
    END_KINDS
        .iter()
        .find(|k| k.name() == kind)
        .map(|k| k.code())
        .ok_or_else(|| value_error(format!("unknown end kind {kind:?}")))
}

#[pymethods]
impl RecordWriter {
    /// Create `path` and write the header (a JSON object); OSError on failure.
    #[new]
    fn new(path: PathBuf, header: &str) -> PyResult<Self> {
        Ok(RecordWriter {
            tap: Some(Tap::create(&path, header, monotonic())?),
        })
    }

    fn start(&mut self, stream: u16) -> PyResult<()> {
        self.put(&Item::Start { stream })
    }

    fn sse(&mut self, stream: u16, text: &str, token_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut ids = Vec::new();
        token_ids_into(token_ids, &mut ids)?;
        self.tap()?.sse(monotonic(), stream, text, &ids);
        Ok(())
    }

    fn sse_id(&mut self, stream: u16, id: &str) -> PyResult<()> {
        self.put(&Item::SseId { stream, id })
    }

    fn sse_choice(&mut self, stream: u16, index: u32) -> PyResult<()> {
        self.put(&Item::SseChoice { stream, index })
    }

    #[pyo3(signature = (stream, completion_tokens, per_step_accepted, per_step_drafted))]
    fn sse_usage(
        &mut self,
        stream: u16,
        completion_tokens: Option<u64>,
        per_step_accepted: &Bound<'_, PyAny>,
        per_step_drafted: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let accepted = counts_bytes(per_step_accepted)?;
        let drafted = counts_bytes(per_step_drafted)?;
        self.put(&Item::SseUsage {
            stream,
            completion_tokens,
            accepted: accepted.as_deref(),
            drafted: drafted.as_deref(),
        })
    }

    /// Step counters of a stock server (`kind` "timings" or "spec", three
    /// optional counts): the server-reported tier's input.
    #[pyo3(signature = (stream, kind, a, b, c))]
    fn sse_counts(
        &mut self,
        stream: u16,
        kind: &str,
        a: Option<u64>,
        b: Option<u64>,
        c: Option<u64>,
    ) -> PyResult<()> {
        let kind = counts_kind(kind)?.code();
        self.put(&Item::SseCounts {
            stream,
            kind,
            values: [a, b, c],
        })
    }

    #[pyo3(signature = (stream, reason = None))]
    fn finish(&mut self, stream: u16, reason: Option<&str>) -> PyResult<()> {
        self.put(&Item::Finish { stream, reason })
    }

    /// A stream that ended otherwise: `kind` is one of END_KINDS.
    fn end(&mut self, stream: u16, kind: &str, status: u16, detail: &str) -> PyResult<()> {
        let code = end_code(kind)?;
        self.put(&Item::End {
            stream,
            code,
            status,
            detail,
        })
    }

    fn frames(&mut self, frames: &Bound<'_, PyAny>) -> PyResult<()> {
        let at = monotonic();
        for f in frames.try_iter()? {
            let data = frame_bytes(&f?)?;
            self.tap()?.item(at, &Item::Frame(data.as_bytes()));
        }
        Ok(())
    }

    fn reject(&mut self, reason: &str) -> PyResult<()> {
        self.put(&Item::Reject(reason))
    }

    /// Telemetry lost on the way (`Reconciler.push_lost`'s argument).
    #[pyo3(signature = (frames))]
    fn lost(&mut self, frames: Option<u64>) -> PyResult<()> {
        self.put(&Item::Lost { frames })
    }

    /// A stream's in-band telemetry missing frames (`Reconciler.push_stream_lost`).
    fn stream_lost(&mut self, stream: u16, reason: &str) -> PyResult<()> {
        self.put(&Item::StreamLost { stream, reason })
    }

    fn finalize(&mut self) -> PyResult<()> {
        self.put(&Item::Finalize)
    }

    /// Write `footer` (None: an interrupted run) and finish the file; OSError
    /// with the first write error. Idempotent.
    #[pyo3(signature = (footer = None))]
    fn close(&mut self, py: Python<'_>, footer: Option<&str>) -> PyResult<()> {
        if let Some(tap) = self.tap.take() {
            py.detach(|| tap.close(monotonic(), footer))?;
        }
        Ok(())
    }
}

/// The bytes of a recording (preamble, header, `items` as `decode_recording`
/// gives them, footer), not compressed: for tools and tests that edit one.
#[pyfunction]
#[pyo3(signature = (header, items, footer = None))]
pub(crate) fn encode_recording<'py>(
    py: Python<'py>,
    header: &str,
    items: &Bound<'py, PyAny>,
    footer: Option<&str>,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut out = record::preamble().to_vec();
    record::encode_item(&mut out, 0.0, &Item::Header(header));
    let mut last = 0.0;
    for item in items.try_iter()? {
        let item = item?;
        let tuple = item.cast::<PyTuple>()?;
        let t: f64 = tuple.get_item(0)?.extract()?;
        let kind: String = tuple.get_item(1)?.extract()?;
        last = t;
        let field = |i: usize| tuple.get_item(i);
        match kind.as_str() {
            "start" => record::encode_item(
                &mut out,
                t,
                &Item::Start {
                    stream: field(2)?.extract()?,
                },
            ),
            "sse" | "sse_id" | "sse_choice" | "sse_usage" | "finish" => {
                let fields: Vec<Bound<'_, PyAny>> = tuple.iter().skip(2).collect();
                if !encode_input(&mut out, t, &kind, &fields)? {
                    return Err(value_error(format!(
                        "invalid recording item {}",
                        item.repr()?
                    )));
                }
            }
            "end" => {
                let name: String = field(3)?.extract()?;
                let detail: String = field(5)?.extract()?;
                record::encode_item(
                    &mut out,
                    t,
                    &Item::End {
                        stream: field(2)?.extract()?,
                        code: end_code(&name)?,
                        status: field(4)?.extract()?,
                        detail: &detail,
                    },
                );
            }
            "frame" => {
                let data = frame_bytes(&field(2)?)?;
                record::encode_item(&mut out, t, &Item::Frame(data.as_bytes()));
            }
            "reject" => {
                let reason: String = field(2)?.extract()?;
                record::encode_item(&mut out, t, &Item::Reject(&reason));
            }
            "lost" => {
                let frames: Option<u64> = field(2)?.extract()?;
                record::encode_item(&mut out, t, &Item::Lost { frames });
            }
            "stream_lost" => {
                let reason: String = field(3)?.extract()?;
                record::encode_item(
                    &mut out,
                    t,
                    &Item::StreamLost {
                        stream: field(2)?.extract()?,
                        reason: &reason,
                    },
                );
            }
            "finalize" => record::encode_item(&mut out, t, &Item::Finalize),
            other => {
                return Err(value_error(format!(
                    "unknown recording item kind {other:?}"
                )))
            }
        }
    }
    if let Some(footer) = footer {
        record::encode_item(&mut out, last, &Item::Footer(footer));
    }
    Ok(PyBytes::new(py, &out))
}
