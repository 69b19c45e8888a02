//! How a stream's HTTP exchange ended when it did not end normally.
//!
//! The client's one mapper (`python/parallelhue/stream_errors.py`) turns an
//! end into the user's one-line message; the Rust HTTP thread, the Python
//! reference reader and `parallelhue replay` all hand it these kinds, so each
//! failure has one message whichever path met it. The codes are stored in
//! recordings: never renumber them.

/// Why a stream ended without a normal finish.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EndKind {
    /// The body ended normally but no chunk carried a `finish_reason`.
    NoFinish = 1,
    /// detail: `host:port`.
    Refused = 2,
    /// detail: `host:port: reason` (also a failed name lookup).
    ConnectFailed = 3,
    ConnectTimeout = 4,
    /// No byte for the read timeout.
    ReadTimeout = 5,
    /// The connection closed inside the response body.
    Closed = 6,
    /// The connection closed before a response head arrived.
    NoResponse = 7,
    /// detail: the broken HTTP body framing.
    Framing = 8,
    /// detail: a malformed response head.
    Protocol = 9,
    /// detail: the SSE/chunk error.
    BadSse = 10,
    /// status: the HTTP status; detail: the start of the error body.
    HttpStatus = 11,
    /// status: the HTTP status; detail: the Content-Type.
    NotSse = 12,
    /// detail: the Content-Encoding the body came in.
    Encoding = 13,
    /// detail: `host:port: reason`.
    Tls = 14,
    /// detail: the I/O error.
    Io = 15,
    /// detail: what failed inside the client while handling the stream.
    Internal = 16,
    /// The client stopped the stream (exact mode, Ctrl-C).
    Cancelled = 17,
}

/// Every kind, in code order.
pub const END_KINDS: [EndKind; 17] = [
    EndKind::NoFinish,
    EndKind::Refused,
    EndKind::ConnectFailed,
    EndKind::ConnectTimeout,
    EndKind::ReadTimeout,
    EndKind::Closed,
    EndKind::NoResponse,
    EndKind::Framing,
    EndKind::Protocol,
    EndKind::BadSse,
    EndKind::HttpStatus,
    EndKind::NotSse,
    EndKind::Encoding,
    EndKind::Tls,
    EndKind::Io,
    EndKind::Internal,
    EndKind::Cancelled,
];

impl EndKind {
    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u8) -> Option<EndKind> {
        END_KINDS.iter().copied().find(|k| k.code() == code)
    }

    /// The name Python sees.
    pub fn name(self) -> &'static str {
        match self {
            EndKind::NoFinish => "no_finish",
            EndKind::Refused => "refused",
            EndKind::ConnectFailed => "connect_failed",
            EndKind::ConnectTimeout => "connect_timeout",
            EndKind::ReadTimeout => "read_timeout",
            EndKind::Closed => "closed",
            EndKind::NoResponse => "no_response",
            EndKind::Framing => "framing",
            EndKind::Protocol => "protocol",
            EndKind::BadSse => "bad_sse",
            EndKind::HttpStatus => "http_status",
            EndKind::NotSse => "not_sse",
            EndKind::Encoding => "encoding",
            EndKind::Tls => "tls",
            EndKind::Io => "io",
            EndKind::Internal => "internal",
            EndKind::Cancelled => "cancelled",
        }
    }
}

/// A stream's end: normal (`kind` None, with the finish reason) or not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub kind: Option<EndKind>,
    pub status: u16,
    pub detail: String,
}

impl Outcome {
    pub fn finished() -> Outcome {
        Outcome {
            kind: None,
            status: 0,
            detail: String::new(),
        }
    }

    pub fn failed(kind: EndKind, detail: impl Into<String>) -> Outcome {
        Outcome {
            kind: Some(kind),
            status: 0,
            detail: detail.into(),
        }
    }

    pub fn http(kind: EndKind, status: u16, detail: impl Into<String>) -> Outcome {
        Outcome {
            kind: Some(kind),
            status,
            detail: detail.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_dense_unique_and_round_trip() {
        for (i, k) in END_KINDS.iter().enumerate() {
            assert_eq!(k.code() as usize, i + 1);
            assert_eq!(EndKind::from_code(k.code()), Some(*k));
        }
        assert_eq!(EndKind::from_code(0), None);
        assert_eq!(EndKind::from_code(18), None);
        let names: std::collections::HashSet<_> = END_KINDS.iter().map(|k| k.name()).collect();
        assert_eq!(names.len(), END_KINDS.len());
    }
}
