//! Every error of an SSE body's events and chunks, worded once (the
//! reference reader, `parallelhue.reference.sse`, words the same), and the
//! limits they name.

use std::fmt;

/// Longest line kept; longer ones are reported and skipped.
pub const MAX_LINE_BYTES: usize = 8 << 20;
/// Most data bytes in one event.
pub const MAX_EVENT_BYTES: usize = 16 << 20;

/// An error in the event stream or in a chunk's JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SseError {
    /// A line longer than [`MAX_LINE_BYTES`] (1-based line number).
    LineTooLong { line: u64 },
    /// An event whose data exceeds [`MAX_EVENT_BYTES`].
    EventTooLarge { line: u64 },
    /// A line that is not valid UTF-8.
    InvalidUtf8 { line: u64 },
    /// The stream ended inside an event (data without the blank line).
    Unterminated,
    /// The data of an event is not JSON.
    Json { message: String },
    /// The JSON is not a chunk: `path` says where, `expected` what.
    Shape {
        path: String,
        expected: &'static str,
    },
    /// The server reported an error inside the stream.
    Server { message: String },
    /// Choice 0 has text or token ids after a chunk gave its finish_reason.
    ContentAfterFinish,
    /// Choice 0 gives another finish_reason than an earlier chunk's.
    FinishReasonChanged { before: String, now: String },
    /// `usage.prompt_tokens` differs from an earlier chunk's.
    PromptTokensChanged { before: u64, now: u64 },
}

impl fmt::Display for SseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SseError::LineTooLong { line } => {
                write!(f, "SSE line {line} longer than {MAX_LINE_BYTES} bytes")
            }
            SseError::EventTooLarge { line } => write!(
                f,
                "SSE event ending at line {line} has more than {MAX_EVENT_BYTES} data bytes"
            ),
            SseError::InvalidUtf8 { line } => write!(f, "invalid UTF-8 in SSE line {line}"),
            SseError::Unterminated => {
                f.write_str("SSE stream ended inside an event (no blank line after its data)")
            }
            SseError::Json { message } => write!(f, "invalid JSON in SSE data: {message}"),
            SseError::Shape { path, expected } => {
                write!(f, "invalid SSE chunk: {path} must be {expected}")
            }
            SseError::Server { message } => write!(f, "server error in SSE stream: {message}"),
            SseError::ContentAfterFinish => {
                f.write_str("invalid SSE chunk: choice 0 has content after its finish_reason")
            }
            SseError::FinishReasonChanged { before, now } => write!(
                f,
                "invalid SSE chunk: choice 0's finish_reason {} after {}",
                shown_reason(Some(now)),
                shown_reason(Some(before))
            ),
            SseError::PromptTokensChanged { before, now } => write!(
                f,
                "invalid SSE chunk: usage.prompt_tokens {now} after {before}"
            ),
        }
    }
}

impl std::error::Error for SseError {}

/// An SSE finish_reason as shown in a message: quoted (at most 40
/// characters), or null.
pub fn shown_reason(reason: Option<&str>) -> String {
    match reason {
        None => "null".to_owned(),
        Some(r) if r.chars().count() > 40 => {
            format!("'{}…'", r.chars().take(40).collect::<String>())
        }
        Some(r) => format!("'{r}'"),
    }
}
