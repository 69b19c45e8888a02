//! The client's HTTP, without Python: the messages it writes and reads
//! (`message`: request, response head, body framing), TLS
//! ([`tls`]), and the HTTP thread (Unix) that does every stream's whole
//! exchange.
//!
//! One thread ([`HttpStreams`]) polls every stream's connection and drives
//! each through its exchange: connect (with the connect timeout; each
//! resolved address in turn), TLS for `https://`, write the request Python
//! composed, read the response head ([`Head`]), then either the error body
//! (status >= 400), a refusal (not `text/event-stream`, or a compressed
//! body), or the SSE body ([`StreamBody`]: HTTP framing,
//! SSE events, chunk JSON). Every delta goes into the run's
//! [`crate::fed::Fed`] — recorded, reconciled, queued for the screen — and
//! the thread finishes each stream itself: a normal end with its finish
//! reason, any other end as an [`crate::outcome::Outcome`] the client's one
//! mapper turns into the user's message.
//!
//! In-band telemetry (docs/PROTOCOL.md, "In-band telemetry") arrives inside
//! the streams themselves: the SSE reader turns its events into frames, which
//! go into the run's `Fed` with the stream's other inputs, in order, exactly
//! like a datagram from the telemetry socket.
//!
//! With several connections open, rounds that read something are at least
//! `min_interval` apart: each read then brings several chunks, and the
//! thread's wake-ups stay bounded whatever the token rate (arrival times are
//! then exact to `min_interval`). One stream's failure — a panic included —
//! ends that stream only.
//!
//! The thread's files: `streams` (the handle: commands in), `thread` (the loop: wait, drive, commands, timeouts, publish),
//! `waiter` (epoll or poll), `exchange` (one connection: connect, TLS,
//! write, read, timeouts), `response` (what its bytes are: head, error
//! body, SSE body), `round` (a round's SSE inputs until they are
//! published), `sse_body` (a body's bytes through the HTTP framing to SSE
//! inputs: [`crate::sse`], [`crate::telemetry::inband`]).

mod message;
mod sse_body;
pub mod tls;

#[cfg(unix)]
mod exchange;
#[cfg(unix)]
mod response;
#[cfg(unix)]
mod round;
#[cfg(unix)]
mod streams;
#[cfg(all(test, unix))]
mod tests;
#[cfg(unix)]
mod thread;
#[cfg(unix)]
mod waiter;

use std::time::Duration;

pub use message::{
    find_head_end, request_bytes, BodyDecoder, BodyError, Framing, Head, HeadError, HeaderError,
    MAX_CHUNK_LINE_BYTES, MAX_HEAD_BYTES,
};
pub use sse_body::{StreamBody, StreamEnd};
#[cfg(unix)]
pub use streams::HttpStreams;

/// The start of an error body kept for the message.
pub const ERROR_BODY_LIMIT: usize = 4096;
/// Open connections from which the thread waits out `min_interval` between
/// two rounds that read something.
pub const COALESCE_STREAMS: usize = 4;
/// The client's `min_interval`: below an engine step of a GPU server at 64
/// streams, and what arrival times are exact to while rounds are spaced.
/// 10 ms rather than 5: half the reads (each `recv` and the TCP
/// acknowledgement it causes cost about as much as parsing the chunks it
/// brings; docs/benchmarks/client.md measures both side by side).
pub const DEFAULT_MIN_INTERVAL: Duration = Duration::from_millis(10);

/// Where the streams go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub tls: bool,
    /// How messages name the server (`host` or `host:port`, as the user wrote it).
    pub shown: String,
}

/// The limits of one exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP connect and TLS handshake.
    pub connect: Duration,
    /// The longest silence while waiting for the response; None: no limit.
    pub read: Option<Duration>,
    /// The longest stall while writing the request.
    pub write: Duration,
}
