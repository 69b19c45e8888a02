//! The test kit: functions that let the Python tests and benches reach the
//! core, built only with the crate's `testkit` feature (which `make native`
//! enables for the development venv; the shipped extension, `make dist` or
//! `pip install .`, is built without it and has none of them).
//!
//! `decode_frame`: one datagram as the vectors' decoded-meaning dict;
//! `sse_inputs`: SSE events as the Rust reader's reconciler inputs;
//! `read_sse_body`: a whole SSE body's bytes through the Rust reader (they
//! hold the Rust decoder, extraction and reader to their references);
//! `pack_inputs`: reconciler inputs as one `push_recorded` buffer (the
//! differential tests and the reconciler benches).

use parallelhue_core::describe::frame_meaning;
use parallelhue_core::http::Framing;
use parallelhue_core::http::{StreamBody, StreamEnd};
use parallelhue_core::protocol;
use parallelhue_core::sse::inputs::{ChunkInputs, SseInput};
use parallelhue_core::sse::{SseEvent, SseParser};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyList, PyString, PyTuple};
use serde_json::Value;

use crate::convert::value_error;
use crate::recording::encode_input;

/// Decode one datagram into the vectors' decoded-meaning dict; raises
#[pyfunction]
pub(crate) fn decode_frame<'py>(
    py: Python<'py>,
    frame: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
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

/// One SSE input as its C2 tuple without the stream: ("sse", text, ids),
/// ("sse_id", id), ("sse_choice", index), ("sse_usage", n, accepted, drafted) or
/// ("sse_counts", kind, a, b, c).
fn input_tuple<'py>(py: Python<'py>, input: SseInput) -> PyResult<Bound<'py, PyTuple>> {
    match input {
        SseInput::Delta { text, token_ids } => ("sse", text, token_ids).into_pyobject(py),
        SseInput::Id(id) => ("sse_id", id).into_pyobject(py),
        SseInput::Choice(index) => ("sse_choice", index).into_pyobject(py),
        SseInput::Frame(frame) => ("frame", PyBytes::new(py, &frame)).into_pyobject(py),
        SseInput::Lost(reason) => ("lost", reason).into_pyobject(py),
        SseInput::Usage {
            completion_tokens,
            per_step_accepted,
            per_step_drafted,
        } => (
            "sse_usage",
            completion_tokens,
            per_step_accepted,
            per_step_drafted,
        )
            .into_pyobject(py),
        SseInput::Counts { kind, values } => {
            let [a, b, c] = values;
            ("sse_counts", kind.name(), a, b, c).into_pyobject(py)
        }
    }
}

/// One stream's SSE events (each the data of one event) through the Rust
/// reader's event-stream parser and extraction: per event, `(inputs,
/// finish_reason so far)`, `("error", message)`, or None (`[DONE]`, an event
/// of its own type).
#[pyfunction]
pub(crate) fn sse_inputs<'py>(
    py: Python<'py>,
    payloads: Vec<Vec<u8>>,
) -> PyResult<Bound<'py, PyList>> {
    let mut parser = SseParser::new();
    let mut extraction = ChunkInputs::new();
    let out = PyList::empty(py);
    for payload in payloads {
        let mut data = b"data: ".to_vec();
        data.extend_from_slice(&payload);
        data.extend_from_slice(b"\n\n");
        for event in parser.feed(&data) {
            match event {
                Err(e) => out.append(("error", e.to_string()))?,
                Ok(SseEvent::Chunk(chunk)) => {
                    let mut inputs = Vec::new();
                    if let Err(e) = extraction.extract(chunk, &mut |i| inputs.push(i)) {
                        out.append(("error", e.to_string()))?;
                        continue;
                    }
                    let tuples = inputs
                        .into_iter()
                        .map(|i| input_tuple(py, i))
                        .collect::<PyResult<Vec<_>>>()?;
                    out.append((PyList::new(py, tuples)?, extraction.finish_reason.clone()))?;
                }
                Ok(_) => out.append(py.None())?,
            }
        }
    }
    Ok(out)
}

/// A stream's body after the HTTP framing, read in `parts` by the Rust
/// reader (`StreamBody`), then ended: `(inputs, end, finish_reason)`, the
/// inputs C2 tuples without the stream, `end` ("done",), ("body_ended",) or
/// ("bad_event", message), as `parallelhue.reference.sse_body.read_body`.
#[pyfunction]
pub(crate) fn read_sse_body<'py>(
    py: Python<'py>,
    parts: Vec<Vec<u8>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let mut body = StreamBody::new(Framing::Close);
    let mut inputs = Vec::new();
    for part in &parts {
        body.feed(part, &mut |i| inputs.push(i));
    }
    body.finish(&mut |i| inputs.push(i));
    let tuples = inputs
        .into_iter()
        .map(|i| input_tuple(py, i))
        .collect::<PyResult<Vec<_>>>()?;
    let end = match &body.end {
        Some(StreamEnd::Done) => ("done",).into_pyobject(py)?,
        Some(StreamEnd::BadEvent(message)) => ("bad_event", message).into_pyobject(py)?,
        Some(StreamEnd::Framing(error)) => ("framing", error.to_string()).into_pyobject(py)?,
        Some(StreamEnd::BodyEnded) | None => ("body_ended",).into_pyobject(py)?,
    };
    (PyList::new(py, tuples)?, end, body.finish_reason.clone()).into_pyobject(py)
}

/// Reconciler inputs (the items of `push_inputs`) as one `push_recorded`
/// buffer, all at time 0.
#[pyfunction]
pub(crate) fn pack_inputs<'py>(
    py: Python<'py>,
    inputs: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut out = Vec::new();
    for item in inputs.try_iter()? {
        let item = item?;
        let tuple = item.cast::<PyTuple>()?;
        let kind: String = tuple.get_item(0)?.extract()?;
        let fields: Vec<Bound<'_, PyAny>> = tuple.iter().skip(1).collect();
        if !encode_input(&mut out, 0.0, &kind, &fields)? {
            return Err(value_error(format!(
                "invalid input {}: expected {}",
                item.repr()?,
                crate::reconciler::INPUT_SHAPES
            )));
        }
    }
    Ok(PyBytes::new(py, &out))
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
