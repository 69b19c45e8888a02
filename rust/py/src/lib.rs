//! `parallelhue._native`: the PyO3 bindings of `parallelhue-core`, one file
//! per area (reconciler, display, streams, receiver, recording, spans,
//! panes), and the test kit (`testkit`, only with the crate's `testkit`
//! feature: the shipped extension carries no test support).
//!
//! The Python API of `Reconciler` is exactly the one of docs/PROTOCOL.md
//! ("Python-facing API"), shared with `parallelhue.reference.Reconciler`.
//! Batch entry points release the GIL (`py.detach`); single small calls do not.
//! The key lists exported here are the one definition of the typed dicts in
//! `parallelhue.ingest.reconciler` (tests/test_native_types.py holds them equal).

mod convert;
mod display;
mod panes;
mod receiver;
mod reconciler;
mod recording;
#[cfg(unix)]
mod spans;
mod streams;
#[cfg(feature = "testkit")]
mod testkit;

use parallelhue_core::outcome::END_KINDS;
use parallelhue_core::protocol;
use parallelhue_core::stats::STAT_KEYS;
use pyo3::prelude::*;

use receiver::Receiver;
use reconciler::Reconciler;
use recording::RecordWriter;
#[cfg(unix)]
use streams::HttpStreams;

/// Keys of `Reconciler.counters()`.
const COUNTER_KEYS: [&str; 7] = [
    "frames",
    "rejected_frames",
    "duplicate_frames",
    "foreign_records",
    "dropped_reported",
    "gaps",
    "late_frames",
];

/// Keys of each dict of `Reconciler.sources()`.
const SOURCE_KEYS: [&str; 10] = [
    "source_id",
    "role",
    "engine",
    "role_derivation",
    "async_scheduling",
    "num_speculative_tokens",
    "plugin_version",
    "engine_version",
    "spec_method",
    "verification",
];

/// Keys of `Receiver.stats()`.
const RECEIVER_KEYS: [&str; 9] = [
    "datagrams",
    "bytes",
    "rejected_uid",
    "last_rejected_uid",
    "accepted_foreign",
    "oversized",
    "batches",
    "errors",
    "rcvbuf",
];

/// The native half of ParallelHue (see docs/PROTOCOL.md, docs/ARCHITECTURE.md).
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("PROTOCOL_VERSION", protocol::PROTOCOL_VERSION)?;
    m.add("MAX_FRAME_BYTES", protocol::MAX_FRAME_BYTES)?;
    m.add("REORDER_WINDOW", parallelhue_core::sequence::REORDER_WINDOW)?;
    m.add(
        "RECORDING_VERSION",
        parallelhue_core::record::FORMAT_VERSION,
    )?;
    // The span record's values, declared once (model/spans.py takes them from here).
    m.add("NO_STEP", parallelhue_core::spans::NO_STEP)?;
    m.add("NO_ROLE", parallelhue_core::spans::NO_ROLE)?;
    m.add(
        "SPAN_RECORD_BYTES",
        parallelhue_core::spans::SPAN_RECORD_BYTES,
    )?;
    m.add("STAT_KEYS", STAT_KEYS.to_vec())?;
    m.add("COUNTER_KEYS", COUNTER_KEYS.to_vec())?;
    m.add("SOURCE_KEYS", SOURCE_KEYS.to_vec())?;
    m.add("RECEIVER_KEYS", RECEIVER_KEYS.to_vec())?;
    m.add(
        "END_KINDS",
        END_KINDS.iter().map(|k| k.name()).collect::<Vec<_>>(),
    )?;
    m.add_class::<Reconciler>()?;
    m.add_class::<spans::SpanRecords>()?;
    m.add_class::<Receiver>()?;
    m.add_class::<RecordWriter>()?;
    #[cfg(unix)]
    {
        use parallelhue_core::http as hs;
        m.add_class::<HttpStreams>()?;
        m.add("SSE_READ_INTERVAL", hs::DEFAULT_MIN_INTERVAL.as_secs_f64())?;
        m.add("SSE_COALESCE_STREAMS", hs::COALESCE_STREAMS)?;
        m.add("ERROR_BODY_LIMIT", hs::ERROR_BODY_LIMIT)?;
        m.add("TELEMETRY_CONTENT_TYPE", hs::TELEMETRY_CONTENT_TYPE)?;
    }
    m.add_function(wrap_pyfunction!(recording::decode_recording, m)?)?;
    m.add_function(wrap_pyfunction!(recording::encode_recording, m)?)?;
    m.add_function(wrap_pyfunction!(panes::tail_pieces, m)?)?;
    #[cfg(feature = "testkit")]
    {
        m.add_function(wrap_pyfunction!(testkit::decode_frame, m)?)?;
        m.add_function(wrap_pyfunction!(testkit::sse_inputs, m)?)?;
        m.add_function(wrap_pyfunction!(testkit::read_sse_body, m)?)?;
        m.add_function(wrap_pyfunction!(testkit::pack_inputs, m)?)?;
    }
    Ok(())
}
