//! Caller arguments: the run id, and the `ValueError` messages of the Python API.

use std::fmt;

/// An invalid argument; `Display` is the Python `ValueError` message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgError {
    RunId(String),
    NumStreams(String),
    Stream { stream: String, n: u16 },
    TokenId(String),
    ChoiceIndex(String),
    CompletionTokens(String),
    StepCount(String),
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgError::RunId(s) => write!(
                f,
                "invalid run id '{s}': expected 32 lowercase hex characters"
            ),
            ArgError::NumStreams(n) => write!(f, "num_streams {n} out of range 1..=65535"),
            ArgError::Stream { stream, n } => write!(f, "stream {stream} out of range 0..{n}"),
            ArgError::TokenId(t) => write!(f, "token id {t} out of range 0..=4294967295"),
            ArgError::ChoiceIndex(i) => write!(f, "choice index {i} out of range 0..=4294967295"),
            ArgError::CompletionTokens(n) => write!(
                f,
                "completion_tokens {n} out of range 0..=18446744073709551615"
            ),
            ArgError::StepCount(n) => write!(f, "per-step count {n} out of range 0..=4294967295"),
        }
    }
}

impl std::error::Error for ArgError {}

/// Parse a run id: 32 lowercase hex characters.
pub fn parse_run_id(s: &str) -> Result<[u8; 16], ArgError> {
    let b = s.as_bytes();
    let hex = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    if b.len() != 32 {
        return Err(ArgError::RunId(s.to_owned()));
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        match (hex(b[2 * i]), hex(b[2 * i + 1])) {
            (Some(h), Some(l)) => *o = h << 4 | l,
            _ => return Err(ArgError::RunId(s.to_owned())),
        }
    }
    Ok(out)
}

/// Lowercase hex of a run id.
pub fn run_id_hex(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}
