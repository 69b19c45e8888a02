//! Frame decoding, exactly per docs/PROTOCOL.md ("ParallelHue telemetry
//! protocol, version 2"). Decoding never panics: every malformed input yields a
//! [`DecodeError`] whose `Display` is the message from the protocol's error
//! table. Checks run in the table's order for the header, then field by field
//! in layout order, so that the first violation found is the one reported.
//!
//! A decoded [`Frame`] borrows its byte strings (fragments, HTTP delta, hello
//! strings, notice messages) from the datagram.

use std::fmt;

/// `"PHUE"`.
pub const MAGIC: [u8; 4] = *b"PHUE";
/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u8 = 2;
/// Bytes in the common header.
pub const HEADER_LEN: usize = 64;
/// Whole datagram, header included.
pub const MAX_FRAME_BYTES: usize = 65_536;
/// Records in one frame.
pub const MAX_RECORDS: usize = 1_024;
/// Tokens in one provenance or text record.
pub const MAX_TOKENS_PER_RECORD: usize = 256;
/// Bytes in a notice message.
pub const MAX_NOTICE_BYTES: usize = 1_024;
/// Stream index reserved for "every stream of the run" (notices only).
pub const ALL_STREAMS: u16 = 0xFFFF;
/// Text token `lead_len` when the sender does not know the byte split.
pub const LEAD_UNKNOWN: u16 = 0xFFFF;
/// Hello `verification` values.
pub const VERIFICATION_NONE: u16 = 0;
pub const VERIFICATION_UNKNOWN: u16 = 4;
/// Bytes of one text token entry: `u32 token_id, u16 frag_len, u8 span_back, u16 lead_len`.
pub const TEXT_TOKEN_BYTES: usize = 9;

/// Finish reason codes.
pub const FINISH_STOP: u8 = 1;

/// The OpenAI `finish_reason` name of a finish code.
pub fn finish_name(code: u8) -> &'static str {
    match code {
        0 => "none",
        1 => "stop",
        2 => "length",
        3 => "abort",
        _ => "error",
    }
}

/// Provenance token roles.
pub const ROLE_PLAIN: u8 = 0;
pub const ROLE_ACCEPTED: u8 = 1;
pub const ROLE_TARGET: u8 = 2;
pub const ROLE_BONUS: u8 = 3;

/// Record flags.
pub const FLAG_FINISHED: u8 = 1;
/// Provenance: a stop token / max_tokens cut this step's tokens.
pub const FLAG_TRIMMED: u8 = 2;
/// Text: a stop string ended the text.
pub const FLAG_TEXT_TRUNCATED: u8 = 2;
/// Text: surplus tokens after the stop string were deleted.
pub const FLAG_TOKENS_TRIMMED: u8 = 4;

/// Frame kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Hello = 1,
    Provenance = 2,
    Text = 3,
    Notice = 4,
}

impl Kind {
    pub fn from_u8(k: u8) -> Option<Kind> {
        match k {
            1 => Some(Kind::Hello),
            2 => Some(Kind::Provenance),
            3 => Some(Kind::Text),
            4 => Some(Kind::Notice),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Hello => "hello",
            Kind::Provenance => "provenance",
            Kind::Text => "text",
            Kind::Notice => "notice",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The common 64-byte header, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub run_id: [u8; 16],
    pub source_id: u64,
    pub seq: u64,
    pub step: u64,
    pub timestamp_ns: u64,
    pub dropped: u32,
}

/// `hello` body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello<'a> {
    /// 1 scheduler, 2 frontend.
    pub role: u8,
    /// 1 vLLM, 2 simulated.
    pub engine: u8,
    /// 0 none, 1 draft ids, 2 counts only.
    pub role_derivation: u8,
    pub async_scheduling: bool,
    pub num_speculative_tokens: u16,
    /// 0 none, 1 standard, 2 synthetic, 3 fly, 4 unknown.
    pub verification: u16,
    pub plugin_version: &'a str,
    pub engine_version: &'a str,
    pub spec_method: &'a str,
}

/// One provenance record (a view into the datagram: decoding allocates no
/// per-record memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProvRecord<'a> {
    pub stream: u16,
    pub flags: u8,
    pub finish_reason: u8,
    pub offset: u32,
    pub drafts_scheduled: u16,
    pub drafts_padded: u16,
    /// `4 * n` bytes: the token ids, little-endian `u32` each.
    pub token_ids_raw: &'a [u8],
    /// `n` roles.
    pub roles: &'a [u8],
}

impl ProvRecord<'_> {
    /// Number of tokens.
    #[inline]
    pub fn len(&self) -> usize {
        self.roles.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.roles.is_empty()
    }

    /// The token ids, in order.
    #[inline]
    pub fn token_ids(&self) -> impl ExactSizeIterator<Item = u32> + '_ {
        self.token_ids_raw.chunks_exact(4).map(le_u32)
    }
}

/// One token of a text record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TextToken {
    pub token_id: u32,
    pub frag_len: u16,
    pub span_back: u8,
    /// Bytes at the start of the fragment from the span_back predecessors
    /// ([`LEAD_UNKNOWN`] when not known).
    pub lead_len: u16,
}

/// One text record (a view into the datagram). `fragments` is the
/// concatenation of every token's fragment (each valid UTF-8 on its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TextRecord<'a> {
    pub stream: u16,
    pub flags: u8,
    pub finish_reason: u8,
    pub offset: u32,
    pub trimmed_tokens: u16,
    /// `9 * n` bytes: per token `u32 token_id`, `u16 frag_len`, `u8 span_back`,
    /// `u16 lead_len`.
    pub tokens_raw: &'a [u8],
    pub fragments: &'a [u8],
    pub http_delta: &'a str,
}

#[inline]
fn text_token(t: &[u8]) -> TextToken {
    TextToken {
        token_id: le_u32(t),
        frag_len: u16::from_le_bytes([t[4], t[5]]),
        span_back: t[6],
        lead_len: u16::from_le_bytes([t[7], t[8]]),
    }
}

impl TextRecord<'_> {
    /// Number of tokens.
    #[inline]
    pub fn len(&self) -> usize {
        self.tokens_raw.len() / TEXT_TOKEN_BYTES
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.tokens_raw.is_empty()
    }

    /// The tokens, in order.
    #[inline]
    pub fn tokens(&self) -> impl ExactSizeIterator<Item = TextToken> + '_ {
        self.tokens_raw
            .chunks_exact(TEXT_TOKEN_BYTES)
            .map(text_token)
    }

    /// The fragment of each token, in order.
    pub fn fragment_slices(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let mut pos = 0usize;
        self.tokens().map(move |t| {
            let s = &self.fragments[pos..pos + t.frag_len as usize];
            pos += t.frag_len as usize;
            s
        })
    }
}

/// One notice record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoticeRecord<'a> {
    pub stream: u16,
    pub code: u16,
    pub message: &'a str,
}

/// A frame body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body<'a> {
    Hello(Hello<'a>),
    Provenance(Vec<ProvRecord<'a>>),
    Text(Vec<TextRecord<'a>>),
    Notice(Vec<NoticeRecord<'a>>),
}

/// A decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    pub header: Header,
    pub body: Body<'a>,
}

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
    LeadBelowSpanBack {
        stream: u16,
        lead_len: u16,
        span_back: u8,
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
            LeadBelowSpanBack {
                stream,
                lead_len,
                span_back,
                index,
            } => write!(
                f,
                "record for stream {stream}: lead_len {lead_len} below span_back {span_back} \
                 at token {index}"
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

/// A bounds-checked little-endian cursor over the datagram. Running out of
/// bytes reports the datagram offset where the field that needed them starts.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    kind: Kind,
}

impl<'a> Reader<'a> {
    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() - self.pos < n {
            return Err(DecodeError::TruncatedBody {
                kind: self.kind,
                pos: self.pos,
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    #[inline]
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    #[inline]
    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    #[inline]
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn finish(&self) -> Result<(), DecodeError> {
        let left = self.buf.len() - self.pos;
        if left != 0 {
            return Err(DecodeError::TrailingBytes {
                kind: self.kind,
                n: left,
            });
        }
        Ok(())
    }
}

#[inline]
fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

#[inline]
fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Decode and check the 64-byte header (and the datagram length against it).
pub fn decode_header(data: &[u8]) -> Result<Header, DecodeError> {
    let len = data.len();
    if len < HEADER_LEN {
        return Err(DecodeError::TruncatedFrame { len });
    }
    if len > MAX_FRAME_BYTES {
        return Err(DecodeError::OversizedFrame { len });
    }
    if data[0..4] != MAGIC {
        return Err(DecodeError::BadMagic {
            got: [data[0], data[1], data[2], data[3]],
        });
    }
    if data[4] != PROTOCOL_VERSION {
        return Err(DecodeError::UnsupportedVersion { version: data[4] });
    }
    let kind = Kind::from_u8(data[5]).ok_or(DecodeError::UnknownKind { kind: data[5] })?;
    let flags = u16::from_le_bytes([data[6], data[7]]);
    if flags != 0 {
        return Err(DecodeError::ReservedHeaderFlags { flags });
    }
    let mut run_id = [0u8; 16];
    run_id.copy_from_slice(&data[8..24]);
    let source_id = le_u64(&data[24..32]);
    if source_id == 0 {
        return Err(DecodeError::ReservedSourceId);
    }
    let body_len = le_u32(&data[60..64]);
    let actual = len - HEADER_LEN;
    if body_len as usize != actual {
        return Err(DecodeError::BodyLengthMismatch {
            header: body_len,
            actual,
        });
    }
    Ok(Header {
        kind,
        run_id,
        source_id,
        seq: le_u64(&data[32..40]),
        step: le_u64(&data[40..48]),
        timestamp_ns: le_u64(&data[48..56]),
        dropped: le_u32(&data[56..60]),
    })
}

/// Decode one datagram.
pub fn decode(data: &[u8]) -> Result<Frame<'_>, DecodeError> {
    let header = decode_header(data)?;
    let mut r = Reader {
        buf: data,
        pos: HEADER_LEN,
        kind: header.kind,
    };
    let body = match header.kind {
        Kind::Hello => Body::Hello(decode_hello(&mut r)?),
        Kind::Provenance => Body::Provenance(decode_provenance(&mut r)?),
        Kind::Text => Body::Text(decode_text(&mut r)?),
        Kind::Notice => Body::Notice(decode_notice(&mut r)?),
    };
    r.finish()?;
    Ok(Frame { header, body })
}

fn decode_hello<'a>(r: &mut Reader<'a>) -> Result<Hello<'a>, DecodeError> {
    let role = r.u8()?;
    if !(1..=2).contains(&role) {
        return Err(DecodeError::HelloUnknownRole { role });
    }
    let engine = r.u8()?;
    if !(1..=2).contains(&engine) {
        return Err(DecodeError::HelloUnknownEngine { engine });
    }
    let role_derivation = r.u8()?;
    if role_derivation > 2 {
        return Err(DecodeError::HelloUnknownDerivation {
            derivation: role_derivation,
        });
    }
    let async_byte = r.u8()?;
    if async_byte > 1 {
        return Err(DecodeError::HelloAsyncScheduling { value: async_byte });
    }
    let k = r.u16()?;
    let verification = r.u16()?;
    if verification > VERIFICATION_UNKNOWN {
        return Err(DecodeError::HelloUnknownVerification { verification });
    }
    let plugin_version = str8(r, "plugin_version")?;
    let engine_version = str8(r, "engine_version")?;
    let spec_method = str8(r, "spec_method")?;
    let none_d = role_derivation == 0;
    if none_d != spec_method.is_empty()
        || none_d != (k == 0)
        || none_d != (verification == VERIFICATION_NONE)
    {
        return Err(DecodeError::HelloInconsistent {
            method: spec_method.to_owned(),
            k,
            derivation: role_derivation,
            verification,
        });
    }
    // Draft ids are only seen without async scheduling; under it only counts.
    if (role_derivation == 1 && async_byte == 1) || (role_derivation == 2 && async_byte == 0) {
        return Err(DecodeError::HelloDerivationAsync {
            derivation: role_derivation,
            async_scheduling: async_byte,
        });
    }
    // The frontend does not schedule: it has no speculative fields to announce.
    if role == 2 && (role_derivation != 0 || async_byte != 0) {
        return Err(DecodeError::HelloFrontendSpec {
            method: spec_method.to_owned(),
            k,
            derivation: role_derivation,
            async_scheduling: async_byte,
            verification,
        });
    }
    Ok(Hello {
        role,
        engine,
        role_derivation,
        async_scheduling: async_byte == 1,
        num_speculative_tokens: k,
        verification,
        plugin_version,
        engine_version,
        spec_method,
    })
}

fn str8<'a>(r: &mut Reader<'a>, field: &'static str) -> Result<&'a str, DecodeError> {
    let n = r.u8()? as usize;
    let b = r.take(n)?;
    std::str::from_utf8(b).map_err(|_| DecodeError::HelloInvalidUtf8 { field })
}

fn record_count(r: &mut Reader<'_>) -> Result<usize, DecodeError> {
    let n = r.u16()?;
    if n == 0 || n as usize > MAX_RECORDS {
        return Err(DecodeError::RecordCount { n });
    }
    Ok(n as usize)
}

/// Streams seen in this frame (65 536 possible values, one bit each).
struct SeenStreams([u64; 1024]);

impl SeenStreams {
    fn new() -> Self {
        SeenStreams([0u64; 1024])
    }

    /// Read a record's stream field and check it is not reserved nor repeated.
    fn check(&mut self, stream: u16) -> Result<(), DecodeError> {
        let (w, b) = (stream as usize / 64, stream as usize % 64);
        if self.0[w] & (1 << b) != 0 {
            return Err(DecodeError::RepeatedStream { stream });
        }
        if stream == ALL_STREAMS {
            return Err(DecodeError::ReservedStream);
        }
        self.0[w] |= 1 << b;
        Ok(())
    }
}

fn check_finish(stream: u16, flags: u8, reason: u8) -> Result<(), DecodeError> {
    let finished = flags & FLAG_FINISHED != 0;
    if reason > 4 || (reason != 0) != finished {
        return Err(DecodeError::FinishMismatch {
            stream,
            reason,
            finished,
        });
    }
    Ok(())
}

fn check_token_count(stream: u16, offset: u32, n: u16, lo: u16) -> Result<(), DecodeError> {
    if n < lo || n as usize > MAX_TOKENS_PER_RECORD {
        return Err(DecodeError::TokenCount { stream, n, lo });
    }
    if offset.checked_add(n as u32).is_none() {
        return Err(DecodeError::OffsetOverflow { stream, offset, n });
    }
    Ok(())
}

fn role_letter(r: u8) -> char {
    match r {
        ROLE_PLAIN => 'P',
        ROLE_ACCEPTED => 'A',
        ROLE_TARGET => 'T',
        _ => 'B',
    }
}

/// The role rules of docs/PROTOCOL.md "provenance".
fn check_roles(
    stream: u16,
    roles: &[u8],
    scheduled: u16,
    trimmed: bool,
) -> Result<(), DecodeError> {
    for (index, &role) in roles.iter().enumerate() {
        if role > ROLE_BONUS {
            return Err(DecodeError::UnknownRole {
                stream,
                role,
                index,
            });
        }
    }
    let n = roles.len();
    let ok = if scheduled == 0 {
        n == 1 && roles[0] == ROLE_PLAIN
    } else {
        let accepted = roles.iter().take_while(|&&r| r == ROLE_ACCEPTED).count();
        if accepted == n {
            trimmed && accepted <= scheduled as usize
        } else if accepted + 1 == n {
            match roles[n - 1] {
                ROLE_TARGET => accepted < scheduled as usize,
                ROLE_BONUS => accepted == scheduled as usize,
                _ => false,
            }
        } else {
            false
        }
    };
    if !ok {
        return Err(DecodeError::RoleSequence {
            stream,
            seq: roles.iter().map(|&r| role_letter(r)).collect(),
        });
    }
    Ok(())
}

fn decode_provenance<'a>(r: &mut Reader<'a>) -> Result<Vec<ProvRecord<'a>>, DecodeError> {
    let count = record_count(r)?;
    let mut seen = SeenStreams::new();
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let stream = r.u16()?;
        seen.check(stream)?;
        let flags = r.u8()?;
        if flags & !(FLAG_FINISHED | FLAG_TRIMMED) != 0 {
            return Err(DecodeError::InvalidFlags { stream, flags });
        }
        let finish_reason = r.u8()?;
        check_finish(stream, flags, finish_reason)?;
        let offset = r.u32()?;
        let n = r.u16()?;
        check_token_count(stream, offset, n, 1)?;
        let drafts_scheduled = r.u16()?;
        let drafts_padded = r.u16()?;
        if drafts_padded > drafts_scheduled {
            return Err(DecodeError::PaddedExceedsScheduled {
                stream,
                padded: drafts_padded,
                scheduled: drafts_scheduled,
            });
        }
        let token_ids_raw = r.take(4 * n as usize)?;
        let roles = r.take(n as usize)?;
        check_roles(stream, roles, drafts_scheduled, flags & FLAG_TRIMMED != 0)?;
        let accepted = roles.iter().filter(|&&x| x == ROLE_ACCEPTED).count();
        // A padded draft slot held no draft: it cannot have been accepted.
        if accepted > usize::from(drafts_scheduled - drafts_padded) {
            return Err(DecodeError::AcceptedExceedsDrafts {
                stream,
                accepted,
                scheduled: drafts_scheduled,
                padded: drafts_padded,
            });
        }
        out.push(ProvRecord {
            stream,
            flags,
            finish_reason,
            offset,
            drafts_scheduled,
            drafts_padded,
            token_ids_raw,
            roles,
        });
    }
    Ok(out)
}

fn decode_text<'a>(r: &mut Reader<'a>) -> Result<Vec<TextRecord<'a>>, DecodeError> {
    let count = record_count(r)?;
    let mut seen = SeenStreams::new();
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let stream = r.u16()?;
        seen.check(stream)?;
        let flags = r.u8()?;
        let finished = flags & FLAG_FINISHED != 0;
        let all = FLAG_FINISHED | FLAG_TEXT_TRUNCATED | FLAG_TOKENS_TRIMMED;
        if flags & !all != 0 || (!finished && flags != 0) {
            return Err(DecodeError::InvalidFlags { stream, flags });
        }
        let finish_reason = r.u8()?;
        check_finish(stream, flags, finish_reason)?;
        // text_truncated and tokens_trimmed both say a stop string ended the request.
        if flags & (FLAG_TEXT_TRUNCATED | FLAG_TOKENS_TRIMMED) != 0 && finish_reason != FINISH_STOP
        {
            return Err(DecodeError::StopFlagsReason {
                stream,
                flags,
                reason: finish_reason,
            });
        }
        let offset = r.u32()?;
        let n = r.u16()?;
        check_token_count(stream, offset, n, if finished { 0 } else { 1 })?;
        let trimmed_tokens = r.u16()?;
        if trimmed_tokens != 0 && flags & FLAG_TOKENS_TRIMMED == 0 {
            return Err(DecodeError::TrimmedWithoutFlag {
                stream,
                n: trimmed_tokens,
            });
        }
        let http_len = r.u32()? as usize;
        let tokens_raw = r.take(TEXT_TOKEN_BYTES * n as usize)?;
        let mut frag_total = 0usize;
        for (index, t) in tokens_raw.chunks_exact(TEXT_TOKEN_BYTES).enumerate() {
            let token = text_token(t);
            check_token_entry(stream, index, token)?;
            frag_total += token.frag_len as usize;
        }
        let frag_start = r.pos;
        let fragments = r.take(frag_total)?;
        // Fast path: fragments and HTTP delta are adjacent; one validation of
        // both, plus character-boundary checks where each piece starts.
        let both = r
            .buf
            .get(frag_start..frag_start + frag_total + http_len)
            .and_then(|b| std::str::from_utf8(b).ok());
        let http_delta = match both {
            Some(s) if boundaries_ok(tokens_raw, fragments, s.as_bytes()) => {
                r.take(http_len)?;
                &s[frag_total..]
            }
            _ => {
                check_fragments(stream, tokens_raw, fragments)?;
                let http = r.take(http_len)?;
                std::str::from_utf8(http).map_err(|_| DecodeError::InvalidUtf8Http { stream })?
            }
        };
        out.push(TextRecord {
            stream,
            flags,
            finish_reason,
            offset,
            trimmed_tokens,
            tokens_raw,
            fragments,
            http_delta,
        });
    }
    Ok(out)
}

/// The per-token rules of a text token entry (docs/PROTOCOL.md "text").
#[inline]
fn check_token_entry(stream: u16, index: usize, t: TextToken) -> Result<(), DecodeError> {
    if t.frag_len == 0 && t.span_back != 0 {
        return Err(DecodeError::SpanBackOnEmpty {
            stream,
            span_back: t.span_back,
            index,
        });
    }
    if t.span_back == 0 && t.lead_len != 0 {
        return Err(DecodeError::LeadWithoutSpanBack {
            stream,
            lead_len: t.lead_len,
            index,
        });
    }
    if t.lead_len != LEAD_UNKNOWN && t.lead_len > t.frag_len {
        return Err(DecodeError::LeadExceedsFragment {
            stream,
            lead_len: t.lead_len,
            frag_len: t.frag_len,
            index,
        });
    }
    // Each predecessor it names gave at least one byte (it ended inside a character).
    if t.lead_len != LEAD_UNKNOWN && t.lead_len < u16::from(t.span_back) {
        return Err(DecodeError::LeadBelowSpanBack {
            stream,
            lead_len: t.lead_len,
            span_back: t.span_back,
            index,
        });
    }
    Ok(())
}

/// Every fragment and the HTTP delta start on a character boundary of
/// `both` (fragments followed by the HTTP delta, valid UTF-8 as a whole).
#[inline]
fn boundaries_ok(tokens_raw: &[u8], fragments: &[u8], both: &[u8]) -> bool {
    let starts_char = |pos: usize| pos >= both.len() || (both[pos] as i8) >= -0x40;
    let mut pos = 0usize;
    for t in tokens_raw.chunks_exact(TEXT_TOKEN_BYTES) {
        if !starts_char(pos) {
            return false;
        }
        pos += usize::from(u16::from_le_bytes([t[4], t[5]]));
    }
    starts_char(fragments.len())
}

/// Each fragment must be valid UTF-8 on its own. Fast path: the whole run is
/// valid and every fragment starts on a character boundary (then each piece
/// is valid); otherwise find the first invalid fragment.
fn check_fragments(stream: u16, tokens_raw: &[u8], fragments: &[u8]) -> Result<(), DecodeError> {
    if std::str::from_utf8(fragments).is_ok() {
        let mut pos = 0usize;
        let mut aligned = true;
        for t in tokens_raw.chunks_exact(TEXT_TOKEN_BYTES) {
            if pos < fragments.len() && (fragments[pos] as i8) < -0x40 {
                aligned = false;
                break;
            }
            pos += usize::from(u16::from_le_bytes([t[4], t[5]]));
        }
        if aligned {
            return Ok(());
        }
    }
    let mut pos = 0usize;
    for (index, t) in tokens_raw.chunks_exact(TEXT_TOKEN_BYTES).enumerate() {
        let end = pos + usize::from(u16::from_le_bytes([t[4], t[5]]));
        if std::str::from_utf8(&fragments[pos..end]).is_err() {
            return Err(DecodeError::InvalidUtf8Fragment { stream, index });
        }
        pos = end;
    }
    Ok(())
}

fn decode_notice<'a>(r: &mut Reader<'a>) -> Result<Vec<NoticeRecord<'a>>, DecodeError> {
    let count = record_count(r)?;
    let mut out = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let stream = r.u16()?;
        let code = r.u16()?;
        let n = r.u16()?;
        if n as usize > MAX_NOTICE_BYTES {
            return Err(DecodeError::NoticeTooLong { stream, n });
        }
        let msg = r.take(n as usize)?;
        let message =
            std::str::from_utf8(msg).map_err(|_| DecodeError::NoticeInvalidUtf8 { stream })?;
        out.push(NoticeRecord {
            stream,
            code,
            message,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(b"PHUE");
        v.push(2);
        v.push(kind);
        v.extend_from_slice(&0u16.to_le_bytes());
        v.extend_from_slice(&[0xab; 16]);
        v.extend_from_slice(&7u64.to_le_bytes());
        v.extend_from_slice(&3u64.to_le_bytes());
        v.extend_from_slice(&9u64.to_le_bytes());
        v.extend_from_slice(&11u64.to_le_bytes());
        v.extend_from_slice(&0u32.to_le_bytes());
        v.extend_from_slice(&(body.len() as u32).to_le_bytes());
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn header_errors_in_table_order() {
        assert_eq!(
            decode(&[0; 10]).unwrap_err().to_string(),
            "truncated frame: 10 bytes, header needs 64"
        );
        assert_eq!(
            decode(&vec![0; 65_537]).unwrap_err().to_string(),
            "oversized frame: 65537 bytes, limit 65536"
        );
        let mut f = header(1, &[]);
        f[0] = b'X';
        assert_eq!(
            decode(&f).unwrap_err().to_string(),
            "bad magic: expected 50485545, got 58485545"
        );
        let mut f = header(9, &[]);
        f[4] = 1;
        assert_eq!(
            decode(&f).unwrap_err().to_string(),
            "unsupported protocol version 1 (this build speaks 2)"
        );
        assert_eq!(
            decode(&header(9, &[])).unwrap_err().to_string(),
            "unknown frame kind 9"
        );
        let mut f = header(1, &[]);
        f[60] = 5;
        assert_eq!(
            decode(&f).unwrap_err().to_string(),
            "body length mismatch: header says 5, datagram has 0"
        );
    }

    #[test]
    fn hello_roundtrip_and_errors() {
        let mut body = vec![1, 2, 1, 0, 3, 0, 1, 0];
        for s in ["0.1.0", "sim-1", "ngram"] {
            body.push(s.len() as u8);
            body.extend_from_slice(s.as_bytes());
        }
        let f = header(1, &body);
        let fr = decode(&f).unwrap();
        match fr.body {
            Body::Hello(h) => {
                assert_eq!(h.spec_method, "ngram");
                assert_eq!(h.num_speculative_tokens, 3);
            }
            _ => panic!(),
        }
        let mut f2 = f.clone();
        f2.push(0);
        let n = f2.len() as u32 - 64;
        f2[60..64].copy_from_slice(&n.to_le_bytes());
        assert_eq!(
            decode(&f2).unwrap_err().to_string(),
            "1 trailing bytes after hello body"
        );
        let f3 = header(1, &[1, 2]);
        assert_eq!(
            decode(&f3).unwrap_err().to_string(),
            "truncated hello body at byte 66"
        );
        let f4 = header(1, &[3]);
        assert_eq!(
            decode(&f4).unwrap_err().to_string(),
            "hello: unknown role 3"
        );
    }

    #[test]
    fn roles() {
        let ok = |r: &[u8], d: u16, t: bool| check_roles(0, r, d, t).is_ok();
        assert!(ok(&[0], 0, false));
        assert!(!ok(&[0, 0], 0, false));
        assert!(ok(&[1, 1, 3], 2, false));
        assert!(!ok(&[1, 1, 2], 2, false));
        assert!(ok(&[1, 2], 2, false));
        assert!(ok(&[2], 3, false));
        assert!(!ok(&[1, 1], 3, false));
        assert!(ok(&[1, 1], 3, true));
        assert!(!ok(&[1, 1, 1, 1], 3, true));
        assert_eq!(
            check_roles(4, &[1, 0, 2], 3, false)
                .unwrap_err()
                .to_string(),
            "record for stream 4: invalid role sequence APT"
        );
        assert_eq!(
            check_roles(4, &[1, 7, 2], 3, false)
                .unwrap_err()
                .to_string(),
            "record for stream 4: unknown role 7 at token 1"
        );
    }
}
