//! `decode_frame`: one datagram as the vectors' decoded-meaning dict;
//! `sse_inputs`: SSE events as the Rust reader's reconciler inputs;
//! `read_sse_body`: a whole SSE body's bytes through the Rust reader. They
//! let the Python tests hold the Rust decoder, extraction and reader to
//! their references.

use parallelhue_core::describe::frame_meaning;
use parallelhue_core::http::Framing;
use parallelhue_core::protocol;
use parallelhue_core::sse::{SseEvent, SseParser};
use parallelhue_core::sse_inputs::{ChunkInputs, SseInput};
use parallelhue_core::sse_stream::{StreamBody, StreamEnd};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyTuple};

use crate::convert::{json_to_py, value_error};

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
