//! The client's HTTP: the messages it writes and reads (`message`), TLS
//! (`tls`), and the HTTP thread that drives every stream's exchange.

mod message;
pub mod tls;

#[cfg(unix)]
mod exchange;

pub use message::{
    find_head_end, request_bytes, BodyDecoder, BodyError, Framing, Head, HeadError, HeaderError,
    MAX_CHUNK_LINE_BYTES, MAX_HEAD_BYTES,
};

#[cfg(unix)]
pub use exchange::{
    HttpStreams, Target, TelemetryEnd, TelemetryState, Timeouts, COALESCE_STREAMS,
    DEFAULT_MIN_INTERVAL, ERROR_BODY_LIMIT, TELEMETRY_CONTENT_TYPE, TELEMETRY_MIN_SILENCE,
};
