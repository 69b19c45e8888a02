//! HTTP/1.1 messages of the client (RFC 9112): the request it writes, the
//! response head it reads, and the response body framing (§6–7): chunked
//! transfer coding, a Content-Length, or "until the connection closes".
//!
//! The HTTP thread ([`crate::http::HttpStreams`]) hands every network read to a
//! [`BodyDecoder`]; bytes may be split anywhere. Chunk extensions and
//! trailers are read and ignored. Errors are precise and final: after one,
//! the decoder accepts nothing more.

use std::fmt;

/// Longest chunk-size line (size, extensions) or trailer line accepted.
pub const MAX_CHUNK_LINE_BYTES: usize = 4096;

/// How the response delimits its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// `Content-Length: n`.
    Length(u64),
    /// Neither: the body ends when the server closes the connection.
    Close,
}

/// A body that breaks its framing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BodyError {
    /// A chunk-size line that is not hexadecimal digits (then extensions).
    BadChunkSize { line: String },
    /// A chunk-size line or trailer line over [`MAX_CHUNK_LINE_BYTES`].
    ChunkLineTooLong,
    /// A chunk's data not followed by CRLF.
    MissingChunkEnd,
    /// The connection closed before the body was complete.
    Incomplete { framing: &'static str },
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyError::BadChunkSize { line } => {
                write!(f, "invalid chunk size line {line:?} in a chunked body")
            }
            BodyError::ChunkLineTooLong => write!(
                f,
                "chunk size or trailer line longer than {MAX_CHUNK_LINE_BYTES} bytes"
            ),
            BodyError::MissingChunkEnd => f.write_str("chunk data not followed by CRLF"),
            BodyError::Incomplete { framing } => {
                write!(
                    f,
                    "the connection closed before the end of the {framing} body"
                )
            }
        }
    }
}

impl std::error::Error for BodyError {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Reading a chunk-size line.
    Size,
    /// Inside a chunk's data: bytes left.
    Data(u64),
    /// After a chunk's data: expecting CR (true) or the LF after it (false).
    DataEnd {
        want_cr: bool,
    },
    /// Reading trailer lines after the last chunk.
    Trailer,
    /// Counting down a Content-Length body.
    Length(u64),
    /// Everything until the connection closes.
    Close,
    Done,
}

/// Incremental decoder of one response body.
#[derive(Clone, Debug)]
pub struct BodyDecoder {
    framing: Framing,
    state: State,
    line: Vec<u8>,
    /// The first error; every later call returns it again.
    error: Option<BodyError>,
}

impl BodyDecoder {
    pub fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Chunked => State::Size,
            Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Close => State::Close,
        };
        BodyDecoder {
            framing,
            state,
            line: Vec::new(),
            error: None,
        }
    }

    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// The whole body was read (the last chunk and trailers, or the length).
    pub fn is_complete(&self) -> bool {
        self.state == State::Done
    }

    /// Decode `input`, appending body bytes to `out`. Bytes after a complete
    /// body are ignored (the transport closes the connection after one
    /// response).
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), BodyError> {
        if let Some(error) = &self.error {
            return Err(error.clone());
        }
        self.decode(input, out)
            .inspect_err(|e| self.error = Some(e.clone()))
    }

    fn decode(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), BodyError> {
        while !input.is_empty() {
            match self.state {
                State::Done => return Ok(()),
                State::Close => {
                    out.extend_from_slice(input);
                    return Ok(());
                }
                State::Length(left) | State::Data(left) => {
                    let take = left.min(input.len() as u64) as usize;
                    out.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    let left = left - take as u64;
                    self.state = match (self.state, left) {
                        (State::Length(_), 0) => State::Done,
                        (State::Length(_), n) => State::Length(n),
                        (_, 0) => State::DataEnd { want_cr: true },
                        (_, n) => State::Data(n),
                    };
                }
                State::DataEnd { want_cr } => {
                    match (want_cr, input[0]) {
                        (true, b'\r') => self.state = State::DataEnd { want_cr: false },
                        // A bare LF is accepted as the line end, as most parsers do.
                        (_, b'\n') => self.state = State::Size,
                        _ => return Err(BodyError::MissingChunkEnd),
                    }
                    input = &input[1..];
                }
                State::Size | State::Trailer => {
                    let Some(end) = input.iter().position(|&b| b == b'\n') else {
                        self.push_line(input)?;
                        return Ok(());
                    };
                    self.push_line(&input[..end])?;
                    input = &input[end + 1..];
                    let mut line = std::mem::take(&mut self.line);
                    if line.last() == Some(&b'\r') {
                        line.pop();
                    }
                    self.state = if self.state == State::Size {
                        match parse_chunk_size(&line) {
                            Some(0) => State::Trailer,
                            Some(n) => State::Data(n),
                            None => {
                                return Err(BodyError::BadChunkSize {
                                    line: String::from_utf8_lossy(&line).into_owned(),
                                })
                            }
                        }
                    } else if line.is_empty() {
                        State::Done
                    } else {
                        State::Trailer
                    };
                    line.clear();
                    self.line = line;
                }
            }
        }
        Ok(())
    }

    /// The connection closed: an error unless the body is complete (or is
    /// delimited by the close).
    pub fn finish(&mut self) -> Result<(), BodyError> {
        if let Some(error) = &self.error {
            return Err(error.clone());
        }
        match self.state {
            State::Done | State::Close => {
                self.state = State::Done;
                Ok(())
            }
            _ => Err(BodyError::Incomplete {
                framing: match self.framing {
                    Framing::Chunked => "chunked",
                    Framing::Length(_) => "Content-Length",
                    Framing::Close => "close-delimited",
                },
            }),
        }
    }

    fn push_line(&mut self, bytes: &[u8]) -> Result<(), BodyError> {
        if self.line.len() + bytes.len() > MAX_CHUNK_LINE_BYTES {
            return Err(BodyError::ChunkLineTooLong);
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }
}

/// `1a;name=value` → 26. At most 16 hex digits; optional whitespace before
/// the extensions.
fn parse_chunk_size(line: &[u8]) -> Option<u64> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 16 {
        return None;
    }
    let rest = &line[digits..];
    let rest = rest
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .map_or(&[][..], |i| &rest[i..]);
    if !rest.is_empty() && rest[0] != b';' {
        return None;
    }
    let text = std::str::from_utf8(&line[..digits]).ok()?;
    u64::from_str_radix(text, 16).ok()
}

// ------------------------------------------------------------------ request

/// A request header name or value that would break the request's framing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderError(pub String);

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HeaderError {}

/// The bytes of one request: `method target HTTP/1.1`, the headers (any
/// Connection, Content-Length or Transfer-Encoding given are replaced),
/// `Content-Length`, `Connection: close` (one exchange per connection), the
/// body.
pub fn request_bytes(
    method: &str,
    target: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Result<Vec<u8>, HeaderError> {
    let token = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic() && b != b':');
    if !token(method) {
        return Err(HeaderError(format!("invalid HTTP method {method:?}")));
    }
    if !target.starts_with('/') || !target.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(HeaderError(format!("invalid request target {target:?}")));
    }
    let mut out = Vec::with_capacity(256 + body.len());
    out.extend_from_slice(format!("{method} {target} HTTP/1.1\r\n").as_bytes());
    for (name, value) in headers {
        if !token(name) {
            return Err(HeaderError(format!("invalid header name {name:?}")));
        }
        if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            return Err(HeaderError(format!(
                "the value of header {name} holds a line break or NUL"
            )));
        }
        let lower = name.to_ascii_lowercase();
        if matches!(
            lower.as_str(),
            "connection" | "content-length" | "transfer-encoding"
        ) {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out.extend_from_slice(body);
    Ok(out)
}

// ---------------------------------------------------------------- response

/// Longest response head (status line and headers) accepted.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// A response head that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadError(pub String);

impl fmt::Display for HeadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HeadError {}

/// A parsed response head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    pub reason: String,
    /// Names as sent; values trimmed.
    pub headers: Vec<(String, Vec<u8>)>,
}

/// A head line for messages as Python's `repr()` shows it (latin-1, at
/// most 80 bytes), so the Rust and the Python reader say the same.
fn shown_line(line: &[u8]) -> String {
    let text: String = line.iter().take(80).map(|&b| b as char).collect();
    let quote = if text.contains('\'') && !text.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::from(quote);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa1).contains(&(c as u32)) || c == '\u{ad}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Where the head in `buf` ends: (head length, separator length).
pub fn find_head_end(buf: &[u8]) -> Option<(usize, usize)> {
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n");
    let lf = buf.windows(2).position(|w| w == b"\n\n");
    match (crlf, lf) {
        (Some(a), Some(b)) if b + 1 < a => Some((b, 2)),
        (Some(a), _) => Some((a, 4)),
        (None, Some(b)) => Some((b, 2)),
        (None, None) => None,
    }
}

/// httparse's error as today's text: it does not say which line, so the
/// line is found again (the first folded line, or the first one that is
/// not `token: value`).
fn httparse_error(raw: &[u8], error: Option<httparse::Error>) -> HeadError {
    let mut lines = raw
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let first = lines.next().unwrap_or(b"");
    if matches!(
        error,
        Some(httparse::Error::Version | httparse::Error::Status)
    ) {
        return HeadError(format!(
            "not an HTTP/1.x status line: {}",
            shown_line(first)
        ));
    }
    let tchar = |b: &u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b);
    for line in lines {
        if line.first().is_some_and(|&b| b == b' ' || b == b'\t') {
            return HeadError("obsolete folded header line in the response".into());
        }
        let colon = line.iter().position(|&b| b == b':');
        let ok = colon.is_some_and(|c| {
            c > 0
                && line[..c].iter().all(tchar)
                && line[c + 1..]
                    .iter()
                    .all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
        });
        if !ok {
            return HeadError(format!(
                "malformed response header line: {}",
                shown_line(line)
            ));
        }
    }
    HeadError(format!(
        "not an HTTP/1.x status line: {}",
        shown_line(first)
    ))
}

impl Head {
    /// Parse the head (without its blank line). Names must be tokens and
    /// values free of control bytes (RFC 9110 §5.1, §5.5), as httparse holds.
    pub fn parse(raw: &[u8]) -> Result<Head, HeadError> {
        // httparse wants the blank line that ends the head.
        let mut full = Vec::with_capacity(raw.len() + 4);
        full.extend_from_slice(raw);
        full.extend_from_slice(b"\r\n\r\n");
        let mut stack = [httparse::EMPTY_HEADER; 32];
        let mut heap;
        let mut response = httparse::Response::new(&mut stack);
        let mut parsed = response.parse(&full);
        if parsed == Err(httparse::Error::TooManyHeaders) {
            heap = vec![httparse::EMPTY_HEADER; memchr::memchr_iter(b'\n', raw).count() + 1];
            response = httparse::Response::new(&mut heap);
            parsed = response.parse(&full);
        }
        match parsed {
            Ok(httparse::Status::Complete(_)) => {}
            // Not reached: the head was given its blank line.
            Ok(httparse::Status::Partial) => return Err(httparse_error(raw, None)),
            Err(e) => return Err(httparse_error(raw, Some(e))),
        }
        Ok(Head {
            status: response.code.unwrap_or(0),
            reason: response.reason.unwrap_or("").to_string(),
            headers: response
                .headers
                .iter()
                .map(|h| (h.name.to_string(), h.value.trim_ascii().to_vec()))
                .collect(),
        })
    }

    /// The values of header `name` (case-insensitive), in order.
    pub fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// The first value of header `name` as text (latin-1), if any.
    pub fn get(&self, name: &str) -> Option<String> {
        self.values(name)
            .next()
            .map(|v| v.iter().map(|&b| b as char).collect())
    }

    /// An interim (1xx) answer, to be skipped; 101 counts as final.
    pub fn is_interim(&self) -> bool {
        (100..200).contains(&self.status) && self.status != 101
    }

    /// How the body of a response to `method` ends (RFC 9112 §6.3).
    pub fn framing(&self, method: &str) -> Result<Framing, HeadError> {
        if method == "HEAD" || self.status == 204 || self.status == 304 || self.status < 200 {
            return Ok(Framing::Length(0));
        }
        let codings: Vec<&[u8]> = self.values("transfer-encoding").collect();
        if !codings.is_empty() {
            let joined = codings.join(&b","[..]);
            let last = joined
                .rsplit(|&b| b == b',')
                .next()
                .unwrap_or(b"")
                .trim_ascii()
                .to_ascii_lowercase();
            return Ok(if last == b"chunked" {
                Framing::Chunked
            } else {
                Framing::Close
            });
        }
        let mut lengths: Vec<&[u8]> = self
            .values("content-length")
            .map(<[u8]>::trim_ascii)
            .collect();
        lengths.sort_unstable();
        lengths.dedup();
        match lengths.as_slice() {
            [] => Ok(Framing::Close),
            [one] if !one.is_empty() && one.iter().all(u8::is_ascii_digit) => {
                std::str::from_utf8(one)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .map(Framing::Length)
                    .ok_or_else(|| HeadError("invalid Content-Length in the response".into()))
            }
            _ => Err(HeadError("invalid Content-Length in the response".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_split(framing: Framing, body: &[u8], cut: usize) -> Result<Vec<u8>, BodyError> {
        let mut d = BodyDecoder::new(framing);
        let mut out = Vec::new();
        d.feed(&body[..cut], &mut out)?;
        d.feed(&body[cut..], &mut out)?;
        d.finish()?;
        Ok(out)
    }

    #[test]
    fn chunked_split_everywhere() {
        let body = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: y\r\n\r\n";
        for cut in 0..=body.len() {
            assert_eq!(
                decode_split(Framing::Chunked, body, cut).unwrap(),
                b"hello world",
                "cut {cut}"
            );
        }
        // Byte by byte, and completion is seen before the close.
        let mut d = BodyDecoder::new(Framing::Chunked);
        let mut out = Vec::new();
        for b in body.chunks(1) {
            d.feed(b, &mut out).unwrap();
        }
        assert!(d.is_complete());
        assert_eq!(out, b"hello world");
    }

    #[test]
    fn chunked_accepts_bare_lf_and_uppercase_hex() {
        let out = decode_split(Framing::Chunked, b"A\nabcdefghij\n0\n\n", 3).unwrap();
        assert_eq!(out, b"abcdefghij");
    }

    #[test]
    fn bytes_after_the_last_chunk_are_ignored() {
        let mut d = BodyDecoder::new(Framing::Chunked);
        let mut out = Vec::new();
        d.feed(b"1\r\na\r\n0\r\n\r\ngarbage", &mut out).unwrap();
        assert!(d.is_complete());
        assert_eq!(out, b"a");
    }

    #[test]
    fn chunked_errors_are_precise() {
        let mut d = BodyDecoder::new(Framing::Chunked);
        let mut out = Vec::new();
        assert_eq!(
            d.feed(b"zz\r\n", &mut out).unwrap_err().to_string(),
            "invalid chunk size line \"zz\" in a chunked body"
        );
        let mut d = BodyDecoder::new(Framing::Chunked);
        assert_eq!(
            d.feed(b"2\r\nabX", &mut out).unwrap_err(),
            BodyError::MissingChunkEnd
        );
        // An error is final.
        assert_eq!(d.feed(b"\r\n", &mut out), Err(BodyError::MissingChunkEnd));
        assert_eq!(d.finish(), Err(BodyError::MissingChunkEnd));
        let mut d = BodyDecoder::new(Framing::Chunked);
        assert_eq!(
            d.feed(&[b'1'; MAX_CHUNK_LINE_BYTES + 1], &mut out)
                .unwrap_err(),
            BodyError::ChunkLineTooLong
        );
        let mut d = BodyDecoder::new(Framing::Chunked);
        assert_eq!(
            d.feed(b"11111111111111111\r\n", &mut out).unwrap_err(),
            BodyError::BadChunkSize {
                line: "11111111111111111".into()
            }
        );
        let mut d = BodyDecoder::new(Framing::Chunked);
        d.feed(b"5\r\nhel", &mut out).unwrap();
        assert_eq!(
            d.finish().unwrap_err().to_string(),
            "the connection closed before the end of the chunked body"
        );
    }

    #[test]
    fn length_and_close() {
        for cut in 0..=8 {
            assert_eq!(
                decode_split(Framing::Length(5), b"hello+++", cut).unwrap(),
                b"hello"
            );
            assert_eq!(
                decode_split(Framing::Close, b"hello+++", cut).unwrap(),
                b"hello+++"
            );
        }
        let mut d = BodyDecoder::new(Framing::Length(5));
        d.feed(b"hel", &mut Vec::new()).unwrap();
        assert!(!d.is_complete());
        assert_eq!(
            d.finish().unwrap_err().to_string(),
            "the connection closed before the end of the Content-Length body"
        );
        assert!(BodyDecoder::new(Framing::Length(0)).is_complete());
    }

    #[test]
    fn request_has_one_content_length_and_connection_close() {
        let headers = vec![
            ("Host".to_string(), "h:1".to_string()),
            ("Connection".to_string(), "keep-alive".to_string()),
            ("content-length".to_string(), "99".to_string()),
            ("Authorization".to_string(), "Bearer sk-x".to_string()),
        ];
        let raw = request_bytes("POST", "/v1/x?q=1", &headers, b"{}").unwrap();
        assert_eq!(
            raw,
            b"POST /v1/x?q=1 HTTP/1.1\r\nHost: h:1\r\nAuthorization: Bearer sk-x\r\n\
              Content-Length: 2\r\nConnection: close\r\n\r\n{}"
                .to_vec()
        );
        let bad = vec![("X".to_string(), "a\r\nEvil: 1".to_string())];
        assert_eq!(
            request_bytes("POST", "/", &bad, b"")
                .unwrap_err()
                .to_string(),
            "the value of header X holds a line break or NUL"
        );
        assert!(request_bytes("POST", "x", &[], b"").is_err());
    }

    #[test]
    fn heads_parse_with_precise_errors() {
        let head = Head::parse(
            b"HTTP/1.1 500 Oops\r\ncontent-type: application/json\r\nTransfer-Encoding: chunked",
        )
        .unwrap();
        assert_eq!((head.status, head.reason.as_str()), (500, "Oops"));
        assert_eq!(
            head.get("Content-Type").as_deref(),
            Some("application/json")
        );
        assert_eq!(head.framing("POST"), Ok(Framing::Chunked));
        let cases: [(&[u8], &str); 4] = [
            (
                b"HTTP/2 200 OK",
                "not an HTTP/1.x status line: 'HTTP/2 200 OK'",
            ),
            (
                b"HTTP/1.1 200 OK\r\nbroken header",
                "malformed response header line: 'broken header'",
            ),
            (
                b"HTTP/1.1 200 OK\r\n folded: x",
                "obsolete folded header line in the response",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2",
                "invalid Content-Length in the response",
            ),
        ];
        for (raw, message) in cases {
            let got = Head::parse(raw).and_then(|h| h.framing("POST").map(|_| h));
            assert_eq!(got.unwrap_err().to_string(), message);
        }
        assert_eq!(find_head_end(b"HTTP/1.1 200 OK\r\n\r\nbody"), Some((15, 4)));
        assert_eq!(find_head_end(b"HTTP/1.1 200 OK\n\nbody"), Some((15, 2)));
        assert_eq!(find_head_end(b"HTTP/1.1 200 OK\r\n"), None);
        let h = Head::parse(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5").unwrap();
        assert_eq!(h.framing("POST"), Ok(Framing::Length(5)));
        assert_eq!(
            Head::parse(b"HTTP/1.1 204 No").unwrap().framing("POST"),
            Ok(Framing::Length(0))
        );
        assert_eq!(
            Head::parse(b"HTTP/1.0 200 OK").unwrap().framing("POST"),
            Ok(Framing::Close)
        );
        assert!(Head::parse(b"HTTP/1.1 100 Continue").unwrap().is_interim());
    }

    #[test]
    fn httparse_errors_name_the_line_it_rejected() {
        let cases: [(&[u8], &str); 6] = [
            (
                b"HTTP/1.1 200 OK\r\nx: 1\r\nbad name: x\r\ny: 2",
                "malformed response header line: 'bad name: x'",
            ),
            (
                b"HTTP/1.1 200 OK\r\nx: a\x01b",
                "malformed response header line: 'x: a\\x01b'",
            ),
            (
                b"HTTP/1.1 200 OK\r\n: v",
                "malformed response header line: ': v'",
            ),
            (
                b"HTTP/1.2 200 OK",
                "not an HTTP/1.x status line: 'HTTP/1.2 200 OK'",
            ),
            (
                b"HTTP/1.1 2000 OK",
                "not an HTTP/1.x status line: 'HTTP/1.1 2000 OK'",
            ),
            (b"", "not an HTTP/1.x status line: ''"),
        ];
        for (raw, message) in cases {
            assert_eq!(Head::parse(raw).unwrap_err().to_string(), message);
        }
    }

    #[test]
    fn heads_past_the_stack_array_keep_every_header() {
        let mut raw = b"HTTP/1.1 200 OK".to_vec();
        for i in 0..40 {
            raw.extend_from_slice(format!("\r\nx-{i}:  v{i} ").as_bytes());
        }
        let head = Head::parse(&raw).unwrap();
        assert_eq!(head.headers.len(), 40);
        assert_eq!(head.headers[39], ("x-39".to_string(), b"v39".to_vec()));
        assert_eq!(head.reason, "OK");
    }
}
