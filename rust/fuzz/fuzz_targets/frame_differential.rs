//! One reading of frames: the Rust decoder (`protocol::decode`, its meaning
//! as `describe::frame_meaning`) and the Python reference decoder
//! (`parallelhue.reference.decode.decode_to_dict`, run in an embedded
//! CPython) accept and refuse the same datagrams: the same meaning, or the
//! same error message (docs/PROTOCOL.md "Decoder errors"). The first input
//! byte, when it is 0x03, patches the current protocol version and a valid
//! body length in, so the body rules are reached.
#![no_main]
use libfuzzer_sys::fuzz_target;
use parallelhue_core::describe::frame_meaning;
use parallelhue_core::protocol;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::OnceLock;

/// `decode_to_dict`, `FrameError` and `json.loads` of the reference, imported once.
struct Reference {
    decode: Py<PyAny>,
    error: Py<PyAny>,
    loads: Py<PyAny>,
}

fn reference() -> &'static Reference {
    static REFERENCE: OnceLock<Reference> = OnceLock::new();
    REFERENCE.get_or_init(|| {
        Python::attach(|py| {
            let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
            let path = py
                .import("sys")
                .and_then(|s| s.getattr("path"))
                .expect("sys.path");
            for dir in ["python", "plugin"] {
                path.call_method1("insert", (0, format!("{root}/{dir}")))
                    .expect("sys.path.insert");
            }
            let module = py
                .import("parallelhue.reference.decode")
                .expect("import parallelhue.reference.decode (run from the repository)");
            Reference {
                decode: module
                    .getattr("decode_to_dict")
                    .expect("decode_to_dict")
                    .unbind(),
                error: module.getattr("FrameError").expect("FrameError").unbind(),
                loads: py
                    .import("json")
                    .and_then(|j| j.getattr("loads"))
                    .expect("loads")
                    .unbind(),
            }
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, raw)) = data.split_first() else {
        return;
    };
    let mut frame = raw.to_vec();
    if mode == 0x03 && frame.len() >= 64 {
        frame[..4].copy_from_slice(b"PHUE");
        frame[4] = protocol::PROTOCOL_VERSION;
        let body = (frame.len() - 64) as u32;
        frame[60..64].copy_from_slice(&body.to_le_bytes());
    }
    let ours = match protocol::decode(&frame) {
        Ok(f) => Ok(frame_meaning(&f).to_string()),
        Err(e) => Err(e.to_string()),
    };
    let refs = reference();
    Python::attach(|py| {
        let theirs = refs.decode.call1(py, (PyBytes::new(py, &frame),));
        match (&ours, theirs) {
            (Ok(json), Ok(meaning)) => {
                let parsed = refs.loads.call1(py, (json.as_str(),)).expect("json");
                let same = parsed.bind(py).eq(meaning.bind(py)).expect("compare");
                assert!(
                    same,
                    "the decoders read {frame:02x?} differently: {json} vs {meaning}"
                );
            }
            (Err(message), Err(error)) => {
                assert!(
                    error.is_instance(py, refs.error.bind(py)),
                    "the reference raised {error} on {frame:02x?}"
                );
                let said = error.value(py).str().expect("str").to_string();
                assert_eq!(
                    &said, message,
                    "the decoders refuse {frame:02x?} differently"
                );
            }
            (Ok(json), Err(error)) => {
                panic!("Rust accepts {frame:02x?} ({json}), the reference refuses: {error}")
            }
            (Err(message), Ok(meaning)) => {
                panic!("the reference accepts {frame:02x?} ({meaning}), Rust refuses: {message}")
            }
        }
    });
});
