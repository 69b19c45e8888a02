//! `parallelhue._native`: the PyO3 bindings of `parallelhue-core`.
//!
//! The Python API of `Reconciler` is exactly the one of docs/PROTOCOL.md
//! ("Python-facing API"), shared with `parallelhue.reference.Reconciler`.
//! Batch entry points release the GIL (`py.detach`); single small calls do not.

mod convert;
mod frame;
mod http;
mod receiver;
mod reconciler;
mod sse;
#[cfg(unix)]
mod sse_reader;

use parallelhue_core::protocol;
use pyo3::prelude::*;

use http::HttpBody;
#[cfg(unix)]
use parallelhue_core::sse_reader as core_sse_reader;
use receiver::Receiver;
use reconciler::Reconciler;
use sse::SseParser;
#[cfg(unix)]
use sse_reader::SseReader;

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
        core_sse_reader::DEFAULT_MIN_INTERVAL.as_secs_f64(),
    )?;
    #[cfg(unix)]
    m.add("SSE_COALESCE_STREAMS", core_sse_reader::COALESCE_STREAMS)?;
    m.add_class::<Receiver>()?;
    m.add_function(wrap_pyfunction!(frame::decode_frame, m)?)?;
    Ok(())
}
