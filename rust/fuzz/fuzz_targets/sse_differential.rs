//! One reading of bytes: the Rust SSE reader (`http::StreamBody`, the
//! body after the HTTP framing) and the Python reference reader
//! (`parallelhue.reference.sse_body.read_body`, run in an embedded CPython)
//! get the same bytes in the same reads and must give the same inputs, end
//! and finish reason (a JSON syntax error compared by its class, as
//! `sse_body.differ` says). The first byte picks how the body is cut into
//! reads: every 1..=32 bytes, or at the positions of later `0x1f` bytes
//! (removed), so a split can fall inside a character, a CRLF or a line.
#![no_main]
use libfuzzer_sys::fuzz_target;
use parallelhue_core::http::Framing;
use parallelhue_core::sse::inputs::SseInput;
use parallelhue_core::http::{StreamBody, StreamEnd};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use std::sync::OnceLock;

/// `read_body` and `differ` of the reference, imported once.
struct Reference {
    read_body: Py<PyAny>,
    differ: Py<PyAny>,
}

fn reference() -> &'static Reference {
    static REFERENCE: OnceLock<Reference> = OnceLock::new();
    REFERENCE.get_or_init(|| {
        Python::attach(|py| {
            let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
            let sys = py.import("sys").expect("sys");
            let path = sys.getattr("path").expect("sys.path");
            for dir in ["python", "plugin"] {
                path.call_method1("insert", (0, format!("{root}/{dir}")))
                    .expect("sys.path.insert");
            }
            let module = py
                .import("parallelhue.reference.sse_body")
                .expect("import parallelhue.reference.sse_body (run from the repository)");
            Reference {
                read_body: module.getattr("read_body").expect("read_body").unbind(),
                differ: module.getattr("differ").expect("differ").unbind(),
            }
        })
    })
}

fn input_tuple<'py>(py: Python<'py>, input: &SseInput) -> Bound<'py, PyTuple> {
    let tuple = match input {
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
            let [a, b, c] = *values;
            ("sse_counts", kind.name(), a, b, c).into_pyobject(py)
        }
        // In-band telemetry, as the reference's `read_body` gives it.
        SseInput::Frame(frame) => ("frame", PyBytes::new(py, frame)).into_pyobject(py),
        SseInput::Lost(reason) => ("lost", reason).into_pyobject(py),
    };
    tuple.expect("tuple")
}

/// The Rust reader's result, shaped as `read_body`'s.
fn native<'py>(py: Python<'py>, parts: &[&[u8]]) -> Bound<'py, PyTuple> {
    let mut body = StreamBody::new(Framing::Close);
    let mut inputs = Vec::new();
    for part in parts {
        body.feed(part, &mut |i| inputs.push(i));
    }
    body.finish(&mut |i| inputs.push(i));
    let list = PyList::new(py, inputs.iter().map(|i| input_tuple(py, i))).expect("list");
    let end = match &body.end {
        Some(StreamEnd::Done) => ("done",).into_pyobject(py),
        Some(StreamEnd::BadEvent(m)) => ("bad_event", m).into_pyobject(py),
        Some(StreamEnd::Framing(e)) => ("framing", e.to_string()).into_pyobject(py),
        Some(StreamEnd::BodyEnded) | None => ("body_ended",).into_pyobject(py),
    }
    .expect("end");
    (list, end, body.finish_reason.clone())
        .into_pyobject(py)
        .expect("result")
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, raw)) = data.split_first() else {
        return;
    };
    let (body, cuts): (Vec<u8>, Vec<usize>) = if seed & 0x80 != 0 {
        // Cut where the input has 0x1f (the byte itself is dropped).
        let mut body = Vec::with_capacity(raw.len());
        let mut cuts = Vec::new();
        for &b in raw {
            if b == 0x1f {
                cuts.push(body.len());
            } else {
                body.push(b);
            }
        }
        (body, cuts)
    } else {
        let step = usize::from(seed % 32) + 1;
        (raw.to_vec(), (step..raw.len()).step_by(step).collect())
    };
    let mut parts: Vec<&[u8]> = Vec::new();
    let mut at = 0;
    for cut in cuts.into_iter().chain([body.len()]) {
        parts.push(&body[at..cut]);
        at = cut;
    }
    let refs = reference();
    Python::attach(|py| {
        let ours = native(py, &parts);
        let py_parts = PyList::new(py, parts.iter().map(|p| PyBytes::new(py, p))).expect("parts");
        let theirs = refs
            .read_body
            .call1(py, (py_parts,))
            .unwrap_or_else(|e| panic!("the reference reader raised: {e}"));
        let verdict = refs.differ.call1(py, (ours, theirs)).expect("differ");
        if !verdict.is_none(py) {
            panic!(
                "the readers disagree on {body:?} in {} reads: {verdict}",
                parts.len()
            );
        }
    });
});
