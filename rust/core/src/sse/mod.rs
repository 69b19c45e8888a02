//! One stream's SSE body, from the HTTP body's bytes to the reconciler's SSE
//! inputs, without Python:
//!
//! - `events`: the WHATWG event-stream grammar, incremental;
//! - `parser`: each event's chunk, read by the fastest reader that answers:
//!   `scan` (a byte scanner for vLLM's compact chunk), `typed` (serde, no
//!   `Value` tree), `value` (`serde_json::Value`: decides everything else,
//!   words every error); where a faster one answers, it gives what `value`
//!   would;
//! - `chunk`: what a chunk is, and which of a choice's fields count;
//!   `error`: every error, worded once;
//! - `inputs`: what each chunk says, as the reconciler's SSE inputs.
//!
//! No I/O and nothing of HTTP: the HTTP thread reads a stream's body through
//! all of it ([`crate::http::StreamBody`]).
//!
//! The pure-Python reference of the same reading is `parallelhue.reference`
//! (`sse`, `sse_body`), held equal by the differential tests.

mod chunk;
mod error;
mod events;
pub mod inputs;
mod parser;
pub mod scan;
mod typed;
mod value;

pub use chunk::{Choice, Chunk, SpecSteps, SseEvent, Usage};
pub use error::{shown_reason, SseError, MAX_EVENT_BYTES, MAX_LINE_BYTES};
pub use events::{EventParser, RawEvent};
pub use parser::{parse_chunk, Parsed, SseParser};
pub use value::parse_chunk_value;
