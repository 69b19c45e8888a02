//! Every way a datagram can fail to decode, with the messages of
//! docs/PROTOCOL.md "Decoder errors".

use std::fmt;

use super::{
    Kind, HEADER_LEN, MAX_FRAME_BYTES, MAX_NOTICE_BYTES, MAX_RECORDS, MAX_TOKENS_PER_RECORD,
    PROTOCOL_VERSION,
};

/// Every way a datagram can fail to decode. `Display` gives exactly the
/// messages of docs/PROTOCOL.md "Decoder errors".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    TruncatedFrame {
        len: usize,
    },
    OversizedFrame {
        len: usize,
    },
    BadMagic {
        got: [u8; 4],
    },
    UnsupportedVersion {
        version: u8,
    },
    UnknownKind {
        kind: u8,
    },
    ReservedHeaderFlags {
        flags: u16,
    },
    ReservedSourceId,
    BodyLengthMismatch {
        header: u32,
        actual: usize,
    },
    TruncatedBody {
        kind: Kind,
        pos: usize,
    },
    TrailingBytes {
        kind: Kind,
        n: usize,
    },
    RecordCount {
        n: u16,
    },
    RepeatedStream {
        stream: u16,
    },
    ReservedStream,
    TokenCount {
        stream: u16,
        n: u16,
        lo: u16,
    },
    OffsetOverflow {
        stream: u16,
        offset: u32,
        n: u16,
    },
    UnknownRole {
        stream: u16,
        role: u8,
        index: usize,
    },
    RoleSequence {
        stream: u16,
        seq: String,
    },
    PaddedExceedsScheduled {
        stream: u16,
        padded: u16,
        scheduled: u16,
    },
    AcceptedExceedsDrafts {
        stream: u16,
        accepted: usize,
        scheduled: u16,
        padded: u16,
    },
    InvalidFlags {
        stream: u16,
        flags: u8,
    },
    FinishMismatch {
        stream: u16,
        reason: u8,
        finished: bool,
    },
    StopFlagsReason {
        stream: u16,
        flags: u8,
        reason: u8,
    },
    SpanBackOnEmpty {
        stream: u16,
        span_back: u8,
        index: usize,
    },
    LeadWithoutSpanBack {
        stream: u16,
        lead_len: u16,
        index: usize,
    },
    LeadExceedsFragment {
        stream: u16,
        lead_len: u16,
        frag_len: u16,
        index: usize,
    },
    InvalidUtf8Fragment {
        stream: u16,
        index: usize,
    },
    InvalidUtf8Http {
        stream: u16,
    },
    TrimmedWithoutFlag {
        stream: u16,
        n: u16,
    },
    HelloUnknownRole {
        role: u8,
    },
    HelloUnknownEngine {
        engine: u8,
    },
    HelloUnknownDerivation {
        derivation: u8,
    },
    HelloAsyncScheduling {
        value: u8,
    },
    HelloUnknownVerification {
        verification: u16,
    },
    HelloSpeculativeTokens {
        k: u16,
    },
    HelloInconsistent {
        method: String,
        k: u16,
        derivation: u8,
        verification: u16,
    },
    HelloDerivationAsync {
        derivation: u8,
        async_scheduling: u8,
    },
    HelloFrontendSpec {
        method: String,
        k: u16,
        derivation: u8,
        async_scheduling: u8,
        verification: u16,
    },
    HelloInvalidUtf8 {
        field: &'static str,
    },
    NoticeTooLong {
        stream: u16,
        n: u16,
    },
    NoticeInvalidUtf8 {
        stream: u16,
    },
}

/// The message table of docs/PROTOCOL.md "Decoder errors": one arm per error,
/// kept in one place (long by design; the reference decoder words the same).
impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use DecodeError::*;
        match self {
            TruncatedFrame { len } => {
                write!(f, "truncated frame: {len} bytes, header needs {HEADER_LEN}")
            }
            OversizedFrame { len } => {
                write!(f, "oversized frame: {len} bytes, limit {MAX_FRAME_BYTES}")
            }
            BadMagic { got } => write!(
                f,
                "bad magic: expected 50485545, got {:02x}{:02x}{:02x}{:02x}",
                got[0], got[1], got[2], got[3]
            ),
            UnsupportedVersion { version } => write!(
                f,
                "unsupported protocol version {version} (this build speaks {PROTOCOL_VERSION})"
            ),
            UnknownKind { kind } => write!(f, "unknown frame kind {kind}"),
            ReservedHeaderFlags { flags } => write!(f, "reserved header flags set: {flags}"),
            ReservedSourceId => f.write_str("source id 0 is reserved"),
            BodyLengthMismatch { header, actual } => write!(
                f,
                "body length mismatch: header says {header}, datagram has {actual}"
            ),
            TruncatedBody { kind, pos } => write!(f, "truncated {kind} body at byte {pos}"),
            TrailingBytes { kind, n } => write!(f, "{n} trailing bytes after {kind} body"),
            RecordCount { n } => write!(f, "record count {n} out of range 1..={MAX_RECORDS}"),
            RepeatedStream { stream } => {
                write!(f, "stream {stream} appears twice in one frame")
            }
            ReservedStream => f.write_str("stream 65535 is reserved"),
            TokenCount { stream, n, lo } => write!(
                f,
                "record for stream {stream}: {n} tokens out of range {lo}..={MAX_TOKENS_PER_RECORD}"
            ),
            OffsetOverflow { stream, offset, n } => write!(
                f,
                "record for stream {stream}: offset {offset} + {n} tokens overflows u32"
            ),
            UnknownRole {
                stream,
                role,
                index,
            } => write!(
                f,
                "record for stream {stream}: unknown role {role} at token {index}"
            ),
            RoleSequence { stream, seq } => {
                write!(f, "record for stream {stream}: invalid role sequence {seq}")
            }
            PaddedExceedsScheduled {
                stream,
                padded,
                scheduled,
            } => write!(
                f,
                "record for stream {stream}: {padded} padded drafts exceed {scheduled} scheduled"
            ),
            AcceptedExceedsDrafts {
                stream,
                accepted,
                scheduled,
                padded,
            } => write!(
                f,
                "record for stream {stream}: {accepted} accepted drafts exceed {scheduled} \
                 scheduled minus {padded} padded"
            ),
            InvalidFlags { stream, flags } => {
                write!(f, "record for stream {stream}: invalid flags {flags}")
            }
            FinishMismatch {
                stream,
                reason,
                finished,
            } => write!(
                f,
                "record for stream {stream}: finish reason {reason} with finished={}",
                u8::from(*finished)
            ),
            StopFlagsReason {
                stream,
                flags,
                reason,
            } => write!(
                f,
                "record for stream {stream}: stop-string flags {flags} with finish reason {reason}"
            ),
            SpanBackOnEmpty {
                stream,
                span_back,
                index,
            } => write!(
                f,
                "record for stream {stream}: span_back {span_back} on empty fragment at token {index}"
            ),
            LeadWithoutSpanBack {
                stream,
                lead_len,
                index,
            } => write!(
                f,
                "record for stream {stream}: lead_len {lead_len} without span_back at token {index}"
            ),
            LeadExceedsFragment {
                stream,
                lead_len,
                frag_len,
                index,
            } => write!(
                f,
                "record for stream {stream}: lead_len {lead_len} exceeds the {frag_len}-byte \
                 fragment at token {index}"
            ),
            InvalidUtf8Fragment { stream, index } => write!(
                f,
                "record for stream {stream}: invalid UTF-8 in fragment of token {index}"
            ),
            InvalidUtf8Http { stream } => {
                write!(f, "record for stream {stream}: invalid UTF-8 in http delta")
            }
            TrimmedWithoutFlag { stream, n } => write!(
                f,
                "record for stream {stream}: trimmed_tokens {n} without tokens_trimmed flag"
            ),
            HelloUnknownRole { role } => write!(f, "hello: unknown role {role}"),
            HelloUnknownEngine { engine } => write!(f, "hello: unknown engine {engine}"),
            HelloUnknownDerivation { derivation } => {
                write!(f, "hello: unknown role derivation {derivation}")
            }
            HelloAsyncScheduling { value } => {
                write!(f, "hello: invalid async_scheduling {value}")
            }
            HelloUnknownVerification { verification } => {
                write!(f, "hello: unknown verification {verification}")
            }
            HelloSpeculativeTokens { k } => write!(
                f,
                "hello: num_speculative_tokens {k} exceeds 255 (a step of K + 1 tokens must fit one record)"
            ),
            HelloInconsistent {
                method,
                k,
                derivation,
                verification,
            } => write!(
                f,
                "hello: inconsistent speculative fields (method '{method}', K {k}, \
                 derivation {derivation}, verification {verification})"
            ),
            HelloDerivationAsync {
                derivation,
                async_scheduling,
            } => write!(
                f,
                "hello: role derivation {derivation} with async_scheduling {async_scheduling}"
            ),
            HelloFrontendSpec {
                method,
                k,
                derivation,
                async_scheduling,
                verification,
            } => write!(
                f,
                "hello: frontend hello with speculative fields (method '{method}', K {k}, \
                 derivation {derivation}, async_scheduling {async_scheduling}, \
                 verification {verification})"
            ),
            HelloInvalidUtf8 { field } => write!(f, "hello: invalid UTF-8 in {field}"),
            NoticeTooLong { stream, n } => write!(
                f,
                "notice for stream {stream}: message of {n} bytes exceeds {MAX_NOTICE_BYTES}"
            ),
            NoticeInvalidUtf8 { stream } => {
                write!(f, "notice for stream {stream}: invalid UTF-8 message")
            }
        }
    }
}

impl std::error::Error for DecodeError {}
