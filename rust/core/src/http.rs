//! HTTP/1.1 response body framing (RFC 9112 §6–7): chunked transfer coding,
//! a Content-Length, or "until the connection closes".
//!
//! The client's lean streaming transport hands every network read to a
//! [`BodyDecoder`], so a read holding twenty chunks costs one call instead of
//! twenty trips through a Python state machine. Bytes may be split anywhere.
//! Chunk extensions and trailers are read and ignored. Errors are precise and
//! final: after one, the decoder accepts nothing more.

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
}
