//! The HTTP telemetry stream (docs/PROTOCOL.md, "HTTP telemetry stream"): bytes in, items out.
//!
//! A stream is a 32-byte preamble naming the run, then items `u8 type, u32
//! length (LE), payload`. A frame item carries one telemetry frame exactly as
//! the emitter sent it as a datagram; this module never looks inside it (the
//! reconciler decodes frames), so it does not depend on the frame protocol
//! version. No I/O: feed it whatever the HTTP body reader returns, in any
//! split. It holds at most one incomplete item (≤ 65 541 bytes): an item
//! length beyond its type's limit is refused from the 5-byte item header,
//! before any payload is buffered. The first error is final.
//!
//! The pure-Python twin is `parallelhue_vllm.telemetry_stream.StreamDecoder`;
//! both pass `tests/vectors/stream/telemetry_stream.json` with the same items
//! and the same error messages.

use std::fmt;

pub const STREAM_MAGIC: [u8; 4] = *b"PHTS";
pub const STREAM_VERSION: u8 = 1;
pub const PREAMBLE_LEN: usize = 32;
pub const ITEM_HEADER_LEN: usize = 5;
pub const MAX_FRAME_ITEM: usize = 65_536;
pub const MAX_END_MESSAGE: usize = 1024;

pub const ITEM_FRAME: u8 = 1;
pub const ITEM_DROPPED: u8 = 2;
pub const ITEM_HEARTBEAT: u8 = 3;
pub const ITEM_END: u8 = 4;

/// End codes (informative: the message says why).
pub const END_HUB_CLOSED: u16 = 1;
pub const END_TOO_SLOW: u16 = 2;
pub const END_OTHER: u16 = 3;

/// The stream's first 32 bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preamble {
    /// The run the server created for this subscriber: use it in the request ids.
    pub run_id: [u8; 16],
    /// The hub's buffer for this subscriber; beyond it frames are dropped (and counted).
    pub buffer_bytes: u32,
    /// The server sends a heartbeat item when the stream was idle this long.
    pub heartbeat_ms: u32,
}

impl Preamble {
    pub fn run_id_hex(&self) -> String {
        self.run_id.iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamItem {
    Preamble(Preamble),
    /// One telemetry frame, byte for byte: hand it to `Reconciler::push_frame`.
    Frame(Vec<u8>),
    /// Frames of this run the server's hub discarded for this subscriber since the
    /// previous `Dropped`: every stream not yet complete has lost telemetry.
    Dropped {
        frames: u32,
    },
    Heartbeat,
    /// The server ended the stream; nothing follows.
    End {
        code: u16,
        message: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamError {
    BadMagic([u8; 4]),
    UnsupportedVersion(u8),
    ReservedPreamble {
        flags: u8,
        reserved: u16,
    },
    UnknownItem {
        kind: u8,
        at: u64,
    },
    Oversized {
        kind: &'static str,
        at: u64,
        len: u32,
        limit: usize,
    },
    Short {
        kind: &'static str,
        at: u64,
        len: u32,
        needs: usize,
    },
    EndMessageUtf8 {
        at: u64,
    },
    AfterEnd {
        at: u64,
    },
    TruncatedPreamble {
        have: usize,
    },
    TruncatedItemHeader {
        at: u64,
        have: usize,
    },
    TruncatedItem {
        kind: &'static str,
        at: u64,
        have: usize,
        len: u32,
    },
    ClosedWithoutEnd,
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("telemetry stream: ")?;
        match self {
            StreamError::BadMagic(m) => write!(
                f,
                "bad magic: expected 50485453, got {:02x}{:02x}{:02x}{:02x}",
                m[0], m[1], m[2], m[3]
            ),
            StreamError::UnsupportedVersion(v) => write!(
                f,
                "unsupported stream version {v} (this build speaks {STREAM_VERSION})"
            ),
            StreamError::ReservedPreamble { flags, reserved } => write!(
                f,
                "reserved preamble field set: flags {flags}, reserved {reserved}"
            ),
            StreamError::UnknownItem { kind, at } => {
                write!(f, "unknown item type {kind} at byte {at}")
            }
            StreamError::Oversized {
                kind,
                at,
                len,
                limit,
            } => write!(
                f,
                "oversized {kind} item at byte {at}: {len} bytes, limit {limit}"
            ),
            StreamError::Short {
                kind,
                at,
                len,
                needs,
            } => {
                write!(
                    f,
                    "short {kind} item at byte {at}: {len} bytes, needs {needs}"
                )
            }
            StreamError::EndMessageUtf8 { at } => {
                write!(f, "end item at byte {at}: invalid UTF-8 message")
            }
            StreamError::AfterEnd { at } => write!(f, "data after the end item at byte {at}"),
            StreamError::TruncatedPreamble { have } => {
                write!(f, "truncated preamble: {have} of {PREAMBLE_LEN} bytes")
            }
            StreamError::TruncatedItemHeader { at, have } => write!(
                f,
                "truncated item header at byte {at}: {have} of {ITEM_HEADER_LEN} bytes"
            ),
            StreamError::TruncatedItem {
                kind,
                at,
                have,
                len,
            } => {
                write!(
                    f,
                    "truncated {kind} item at byte {at}: {have} of {len} bytes"
                )
            }
            StreamError::ClosedWithoutEnd => f.write_str("connection closed without an end item"),
        }
    }
}

impl std::error::Error for StreamError {}

/// (name, shortest payload, longest payload) of a known item type.
fn item_limits(kind: u8) -> Option<(&'static str, usize, usize)> {
    match kind {
        ITEM_FRAME => Some(("frame", 1, MAX_FRAME_ITEM)),
        ITEM_DROPPED => Some(("dropped", 4, 4)),
        ITEM_HEARTBEAT => Some(("heartbeat", 0, 0)),
        ITEM_END => Some(("end", 2, 2 + MAX_END_MESSAGE)),
        _ => None,
    }
}

/// Incremental decoder of one telemetry stream.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    buf: Vec<u8>,
    /// Stream offset of `buf[0]`.
    position: u64,
    preamble_done: bool,
    ended: bool,
    error: Option<StreamError>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes of the stream consumed (the preamble and whole items).
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Bytes held for an incomplete item (never more than 65 541).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Whether the end item was decoded.
    pub fn ended(&self) -> bool {
        self.ended
    }

    fn fail(&mut self, error: StreamError) -> Result<(), StreamError> {
        self.error = Some(error.clone());
        Err(error)
    }

    /// Decode what `data` completes, appending items to `out`. On error the items
    /// decoded before the violation are in `out`; every later call returns the error.
    pub fn push(&mut self, data: &[u8], out: &mut Vec<StreamItem>) -> Result<(), StreamError> {
        if let Some(error) = &self.error {
            return Err(error.clone());
        }
        if self.ended {
            if data.is_empty() {
                return Ok(());
            }
            return self.fail(StreamError::AfterEnd { at: self.position });
        }
        // Whole items straight from `data` when nothing is pending: no copy into buf.
        if self.buf.is_empty() {
            let used = self.decode(data, out);
            return match used {
                Ok(n) => {
                    self.buf.extend_from_slice(&data[n..]);
                    Ok(())
                }
                Err(e) => self.fail(e),
            };
        }
        self.buf.extend_from_slice(data);
        let buf = std::mem::take(&mut self.buf);
        let used = self.decode(&buf, out);
        match used {
            Ok(n) => {
                self.buf = buf;
                self.buf.drain(..n);
                Ok(())
            }
            Err(e) => self.fail(e),
        }
    }

    /// Decode complete elements at the start of `data`; returns the bytes consumed.
    fn decode(&mut self, data: &[u8], out: &mut Vec<StreamItem>) -> Result<usize, StreamError> {
        let mut offset = 0usize;
        if !self.preamble_done {
            if data.len() >= 4 && data[..4] != STREAM_MAGIC {
                return Err(StreamError::BadMagic([data[0], data[1], data[2], data[3]]));
            }
            if data.len() < PREAMBLE_LEN {
                return Ok(0);
            }
            let version = data[4];
            if version != STREAM_VERSION {
                return Err(StreamError::UnsupportedVersion(version));
            }
            let flags = data[5];
            let reserved = u16::from_le_bytes([data[6], data[7]]);
            if flags != 0 || reserved != 0 {
                return Err(StreamError::ReservedPreamble { flags, reserved });
            }
            let mut run_id = [0u8; 16];
            run_id.copy_from_slice(&data[8..24]);
            out.push(StreamItem::Preamble(Preamble {
                run_id,
                buffer_bytes: u32_at(data, 24),
                heartbeat_ms: u32_at(data, 28),
            }));
            self.preamble_done = true;
            offset = PREAMBLE_LEN;
            self.position += PREAMBLE_LEN as u64;
        }
        while data.len() - offset >= ITEM_HEADER_LEN {
            let kind = data[offset];
            let len = u32_at(data, offset + 1);
            let at = self.position;
            let (name, low, high) =
                item_limits(kind).ok_or(StreamError::UnknownItem { kind, at })?;
            if len as usize > high {
                return Err(StreamError::Oversized {
                    kind: name,
                    at,
                    len,
                    limit: high,
                });
            }
            if (len as usize) < low {
                return Err(StreamError::Short {
                    kind: name,
                    at,
                    len,
                    needs: low,
                });
            }
            let start = offset + ITEM_HEADER_LEN;
            let end = start + len as usize;
            if end > data.len() {
                break;
            }
            let payload = &data[start..end];
            let item = match kind {
                ITEM_FRAME => StreamItem::Frame(payload.to_vec()),
                ITEM_DROPPED => StreamItem::Dropped {
                    frames: u32_at(payload, 0),
                },
                ITEM_HEARTBEAT => StreamItem::Heartbeat,
                _ => {
                    let code = u16::from_le_bytes([payload[0], payload[1]]);
                    let message = std::str::from_utf8(&payload[2..])
                        .map_err(|_| StreamError::EndMessageUtf8 { at })?
                        .to_owned();
                    StreamItem::End { code, message }
                }
            };
            let is_end = matches!(item, StreamItem::End { .. });
            out.push(item);
            offset = end;
            self.position += (ITEM_HEADER_LEN + len as usize) as u64;
            if is_end {
                self.ended = true;
                if offset < data.len() {
                    return Err(StreamError::AfterEnd { at: self.position });
                }
                break;
            }
        }
        Ok(offset)
    }

    /// The connection closed: Ok only when the stream ended with its end item.
    pub fn finish(&mut self) -> Result<(), StreamError> {
        if let Some(error) = &self.error {
            return Err(error.clone());
        }
        if self.ended {
            return Ok(());
        }
        let have = self.buf.len();
        let error = if !self.preamble_done {
            StreamError::TruncatedPreamble { have }
        } else if have == 0 {
            StreamError::ClosedWithoutEnd
        } else if have < ITEM_HEADER_LEN {
            StreamError::TruncatedItemHeader {
                at: self.position,
                have,
            }
        } else {
            // The header passed its checks when it arrived, so the type is known.
            let (kind, _, _) = item_limits(self.buf[0]).unwrap_or(("unknown", 0, 0));
            StreamError::TruncatedItem {
                kind,
                at: self.position,
                have: have - ITEM_HEADER_LEN,
                len: u32_at(&self.buf, 1),
            }
        };
        self.fail(error)
    }
}

fn u32_at(data: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn vectors() -> Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/vectors/stream/telemetry_stream.json");
        serde_json::from_str(&std::fs::read_to_string(path).expect("stream vectors")).unwrap()
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn meaning(item: &StreamItem) -> Value {
        match item {
            StreamItem::Preamble(p) => json!({
                "kind": "preamble", "run_id": p.run_id_hex(),
                "buffer_bytes": p.buffer_bytes, "heartbeat_ms": p.heartbeat_ms,
            }),
            StreamItem::Frame(f) => json!({"kind": "frame", "hex": hex(f)}),
            StreamItem::Dropped { frames } => json!({"kind": "dropped", "frames": frames}),
            StreamItem::Heartbeat => json!({"kind": "heartbeat"}),
            StreamItem::End { code, message } => {
                json!({"kind": "end", "code": code, "message": message})
            }
        }
    }

    /// Feed `bytes` in pieces of `step` (0 = all at once); items and the error, if any.
    fn run(bytes: &[u8], step: usize, finish: bool) -> (Vec<Value>, Option<String>) {
        let mut decoder = StreamDecoder::new();
        let mut out = Vec::new();
        let pieces: Vec<&[u8]> = if step == 0 {
            vec![bytes]
        } else {
            bytes.chunks(step).collect()
        };
        for piece in pieces {
            if let Err(e) = decoder.push(piece, &mut out) {
                return (out.iter().map(meaning).collect(), Some(e.to_string()));
            }
            assert!(decoder.buffered() <= ITEM_HEADER_LEN + MAX_FRAME_ITEM + PREAMBLE_LEN);
        }
        let error = if finish {
            decoder.finish().err().map(|e| e.to_string())
        } else {
            None
        };
        (out.iter().map(meaning).collect(), error)
    }

    #[test]
    fn vectors_decode_identically_in_every_split() {
        let doc = vectors();
        let cases = doc["vectors"].as_array().expect("vectors");
        assert!(cases.len() >= 10);
        for case in cases {
            let name = case["name"].as_str().unwrap();
            let bytes = unhex(case["hex"].as_str().unwrap());
            let finish = case["finish"].as_bool().unwrap();
            let want_items = case["items"].as_array().unwrap().clone();
            let want_error = case["error"].as_str().map(str::to_owned);
            for step in [0, 1, 2, 3, 5, 7, 31, 32, 33, 4096] {
                let (items, error) = run(&bytes, step, finish);
                assert_eq!(items, want_items, "{name}: items (step {step})");
                assert_eq!(error, want_error, "{name}: error (step {step})");
            }
        }
    }

    #[test]
    fn an_error_is_final() {
        let mut decoder = StreamDecoder::new();
        let mut out = Vec::new();
        let first = decoder.push(b"XXXX", &mut out).unwrap_err();
        assert_eq!(
            first.to_string(),
            "telemetry stream: bad magic: expected 50485453, got 58585858"
        );
        assert_eq!(decoder.push(b"", &mut out).unwrap_err(), first);
        assert_eq!(decoder.finish().unwrap_err(), first);
    }

    #[test]
    fn an_oversized_length_is_refused_before_its_payload_arrives() {
        let mut stream = b"PHTS\x01\x00\x00\x00".to_vec();
        stream.extend_from_slice(&[7u8; 16]);
        stream.extend_from_slice(&[0u8; 8]);
        stream.push(ITEM_FRAME);
        stream.extend_from_slice(&u32::MAX.to_le_bytes());
        let mut decoder = StreamDecoder::new();
        let mut out = Vec::new();
        let error = decoder.push(&stream, &mut out).unwrap_err();
        assert_eq!(
            error.to_string(),
            "telemetry stream: oversized frame item at byte 32: 4294967295 bytes, limit 65536"
        );
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn the_largest_frame_item_decodes_and_the_next_size_does_not() {
        let mut stream = b"PHTS\x01\x00\x00\x00".to_vec();
        stream.extend_from_slice(&[7u8; 24]);
        let frame: Vec<u8> = (0..MAX_FRAME_ITEM).map(|i| (i % 251) as u8).collect();
        stream.push(ITEM_FRAME);
        stream.extend_from_slice(&(MAX_FRAME_ITEM as u32).to_le_bytes());
        stream.extend_from_slice(&frame);
        let mut decoder = StreamDecoder::new();
        let mut out = Vec::new();
        for piece in stream.chunks(1000) {
            decoder.push(piece, &mut out).unwrap();
        }
        assert_eq!(out.last(), Some(&StreamItem::Frame(frame)));
        assert_eq!(decoder.buffered(), 0);
        let mut header = vec![ITEM_FRAME];
        header.extend_from_slice(&(MAX_FRAME_ITEM as u32 + 1).to_le_bytes());
        assert_eq!(
            decoder.push(&header, &mut out).unwrap_err().to_string(),
            "telemetry stream: oversized frame item at byte 65573: 65537 bytes, limit 65536"
        );
    }
}
