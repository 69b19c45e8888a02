//! ParallelHue core: telemetry frame decoding, per-source sequence tracking,
//! the three-witness reconciler, HTTP body framing, SSE parsing and the HTTP
//! telemetry stream. No Python here: `cargo test` runs without an interpreter. See docs/PROTOCOL.md for the contract.

pub mod describe;
pub mod encode;
pub mod http;
pub mod protocol;
#[cfg(target_os = "linux")]
pub mod receiver;
#[cfg(not(target_os = "linux"))]
#[path = "receiver_unsupported.rs"]
pub mod receiver;
pub mod reconcile;
pub mod sequence;
pub mod sse;
#[cfg(unix)]
pub mod sse_reader;
pub mod sse_stream;
pub mod stats;
pub mod telemetry_stream;
pub mod text;
pub mod window;
pub mod workload;

pub use protocol::{decode, DecodeError, Frame};
pub use reconcile::{Event, Reconciler, Verdict};
