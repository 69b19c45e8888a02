//! ParallelHue core: telemetry frame decoding, per-source sequence tracking,
//! the three-witness reconciler, in-band telemetry, and the client's
//! ingest path — the HTTP exchange of every stream (TLS included), SSE
//! parsing, the telemetry socket, the `--record` tap and what the screen is
//! handed. No Python here:
//! `cargo test` runs without an interpreter. See docs/PROTOCOL.md for the
//! contract and docs/ARCHITECTURE.md for the picture.

/// Test kit: a frame's decoded meaning as the vectors' JSON (tests, the
/// extension's test kit, fuzzing).
#[cfg(any(test, feature = "testkit"))]
pub mod describe;
pub mod digest;
/// Test kit: a frame encoder (tests, benches, fuzzing; the production
/// encoder is the Python `parallelhue_vllm.wire`).
#[cfg(any(test, feature = "testkit"))]
pub mod encode;
pub mod fed;
pub mod http;
pub mod outcome;
pub mod protocol;
pub mod reconcile;
pub mod record;
pub mod sequence;
pub mod spans;
pub mod sse;
pub mod stats;
#[cfg(unix)]
mod sys;
pub mod tap;
pub mod telemetry;
pub mod text;
pub mod window;
/// Test kit: a deterministic synthetic workload (tests and benchmarks).
#[cfg(any(test, feature = "testkit"))]
pub mod workload;

pub use protocol::{decode, DecodeError, Frame};
pub use reconcile::{Event, Reconciler, Verdict};
