//! One telemetry response body, from network reads to items: the HTTP body
//! framing ([`super::BodyDecoder`]), then the telemetry stream's decoder
//! ([`crate::telemetry::stream::StreamDecoder`]).

use std::fmt;

use super::message::{BodyDecoder, BodyError, Framing};
use crate::telemetry::stream::{StreamDecoder, StreamError, StreamItem};

/// How a telemetry response body ended (the client's HTTP thread reads it
/// with [`TelemetryBody`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BodyEnd {
    /// The server's end item: the stream is over, nothing was lost in it.
    Server { code: u16, message: String },
    /// The stream's bytes broke its framing, or it was cut off.
    Stream(StreamError),
    /// The HTTP body framing broke (or the connection closed inside the HTTP body).
    Http(BodyError),
}

impl fmt::Display for BodyEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyEnd::Server { code, message } => write!(
                f,
                "telemetry stream: the server ended it (code {code}): {message}"
            ),
            BodyEnd::Stream(e) => e.fmt(f),
            BodyEnd::Http(e) => write!(f, "telemetry stream: invalid HTTP body: {e}"),
        }
    }
}

/// One telemetry response body being read.
#[derive(Debug)]
pub struct TelemetryBody {
    body: BodyDecoder,
    stream: StreamDecoder,
    decoded: Vec<u8>,
    /// Set once; after it, input is ignored.
    pub end: Option<BodyEnd>,
}

impl TelemetryBody {
    pub fn new(framing: Framing) -> Self {
        TelemetryBody {
            body: BodyDecoder::new(framing),
            stream: StreamDecoder::new(),
            decoded: Vec::new(),
            end: None,
        }
    }

    /// Bytes from the connection; the items they complete are appended to `out`.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<StreamItem>) {
        if self.end.is_some() {
            return;
        }
        self.decoded.clear();
        let framing = self.body.feed(input, &mut self.decoded);
        let from = out.len();
        let pushed = self.stream.push(&self.decoded, out);
        if let Some(StreamItem::End { code, message }) = out[from..].last() {
            self.end = Some(BodyEnd::Server {
                code: *code,
                message: message.clone(),
            });
        }
        if let Err(e) = pushed {
            self.end = Some(BodyEnd::Stream(e));
        }
        if self.end.is_some() {
            return;
        }
        match framing {
            Err(e) => self.end = Some(BodyEnd::Http(e)),
            Ok(()) if self.body.is_complete() => self.finish_stream(),
            Ok(()) => {}
        }
    }

    /// The connection closed.
    pub fn finish(&mut self) {
        if self.end.is_some() {
            return;
        }
        match self.body.finish() {
            Err(e) => self.end = Some(BodyEnd::Http(e)),
            Ok(()) => self.finish_stream(),
        }
    }

    fn finish_stream(&mut self) {
        if let Err(e) = self.stream.finish() {
            self.end = Some(BodyEnd::Stream(e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::stream::{ITEM_DROPPED, ITEM_END, ITEM_FRAME, ITEM_HEARTBEAT};

    fn chunk(bytes: &[u8]) -> Vec<u8> {
        let mut out = format!("{:x}\r\n", bytes.len()).into_bytes();
        out.extend_from_slice(bytes);
        out.extend_from_slice(b"\r\n");
        out
    }

    fn preamble_bytes() -> Vec<u8> {
        let mut p = b"PHTS\x01\x00\x00\x00".to_vec();
        p.extend_from_slice(&[9u8; 16]);
        p.extend_from_slice(&4096u32.to_le_bytes());
        p.extend_from_slice(&2000u32.to_le_bytes());
        p
    }

    fn item(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![kind];
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(payload);
        out
    }

    /// (items, end) of a chunked body fed in pieces of `step`, then closed.
    fn body_run(body: &[u8], step: usize) -> (Vec<StreamItem>, Option<BodyEnd>) {
        let mut tb = TelemetryBody::new(Framing::Chunked);
        let mut out = Vec::new();
        for piece in body.chunks(step) {
            tb.feed(piece, &mut out);
        }
        tb.finish();
        (out, tb.end)
    }

    #[test]
    fn a_chunked_body_gives_the_items_and_how_it_ended_in_every_split() {
        let mut stream = preamble_bytes();
        stream.extend(item(ITEM_FRAME, b"PHUE-frame"));
        stream.extend(item(ITEM_DROPPED, &3u32.to_le_bytes()));
        stream.extend(item(ITEM_HEARTBEAT, b""));
        let mut end = 2u16.to_le_bytes().to_vec();
        end.extend_from_slice(b"too slow");
        stream.extend(item(ITEM_END, &end));
        let mut body = Vec::new();
        for piece in stream.chunks(11) {
            body.extend(chunk(piece));
        }
        body.extend_from_slice(b"0\r\n\r\n");
        for step in [1, 2, 7, 64, 4096] {
            let (items, end) = body_run(&body, step);
            assert_eq!(items.len(), 5, "step {step}");
            assert_eq!(items[1], StreamItem::Frame(b"PHUE-frame".to_vec()));
            assert_eq!(items[2], StreamItem::Dropped { frames: 3 });
            let end = end.unwrap();
            assert_eq!(
                end,
                BodyEnd::Server {
                    code: 2,
                    message: "too slow".into()
                }
            );
            assert_eq!(
                end.to_string(),
                "telemetry stream: the server ended it (code 2): too slow"
            );
        }
        // Cut off after a whole item: the stream's own error.
        let mut cut = chunk(&preamble_bytes());
        cut.extend(chunk(&item(ITEM_HEARTBEAT, b"")));
        let (items, end) = body_run(&cut, 5);
        assert_eq!(items.len(), 2);
        assert_eq!(
            end.unwrap().to_string(),
            "telemetry stream: invalid HTTP body: the connection closed before the end of the chunked body"
        );
        // The HTTP body ends properly but the stream has no end item.
        cut.extend_from_slice(b"0\r\n\r\n");
        let (_, end) = body_run(&cut, 3);
        assert_eq!(end, Some(BodyEnd::Stream(StreamError::ClosedWithoutEnd)));
        // Broken chunk framing.
        let (_, end) = body_run(b"zz\r\n", 1);
        assert_eq!(
            end.unwrap().to_string(),
            "telemetry stream: invalid HTTP body: invalid chunk size line \"zz\" in a chunked body"
        );
        // Not a telemetry stream at all.
        let (items, end) = body_run(&chunk(b"<html>"), 64);
        assert!(items.is_empty());
        assert_eq!(
            end.unwrap().to_string(),
            "telemetry stream: bad magic: expected 50485453, got 3c68746d"
        );
    }
}
