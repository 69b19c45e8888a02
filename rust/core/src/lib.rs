//! ParallelHue core: telemetry frame decoding, per-source sequence tracking,
//! the three-witness reconciler and SSE parsing. No Python here: `cargo test`
//! runs without an interpreter.
