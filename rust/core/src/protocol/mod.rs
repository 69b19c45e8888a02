//! Frame decoding, exactly per docs/PROTOCOL.md ("ParallelHue telemetry
//! protocol, version 3"). Decoding never panics: every malformed input yields a
//! [`DecodeError`] whose `Display` is the message from the protocol's error
//! table. Checks run in the table's order for the header, then field by field
//! in layout order, so that the first violation found is the one reported.
//!
//! A decoded [`Frame`] borrows its byte strings (fragments, HTTP delta, hello
//! strings, notice messages) from the datagram.

use std::fmt;

mod error;
mod hello;
mod reader;
mod records;

pub use error::DecodeError;
pub use hello::{Hello, HelloFields};
pub use records::{NoticeRecord, ProvRecord, TextRecord, TextToken};

use hello::decode_hello;
use reader::{le_u32, le_u64, Reader};
use records::{decode_notice, decode_provenance, decode_text};

/// `"PHUE"`.
pub const MAGIC: [u8; 4] = *b"PHUE";
/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u8 = 3;
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
/// Text token `lead_len` when the sender does not know the byte split (or,
/// on an empty fragment, its give count).
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
    decode_reusing(data, &mut RecordBufs::default())
}

/// Decode one datagram into the record vectors of `bufs` (their memory, not
/// their contents: the frame is the one [`decode`] gives). Give the body back
/// with [`RecordBufs::recycle`] and the next frame allocates nothing; a frame
/// that fails to decode drops its vector (the next one allocates again).
pub fn decode_reusing<'a>(data: &'a [u8], bufs: &mut RecordBufs) -> Result<Frame<'a>, DecodeError> {
    let header = decode_header(data)?;
    let mut r = Reader {
        buf: data,
        pos: HEADER_LEN,
        kind: header.kind,
    };
    let body = match header.kind {
        Kind::Hello => Body::Hello(decode_hello(&mut r)?),
        Kind::Provenance => Body::Provenance(decode_provenance(&mut r, bufs.take_prov())?),
        Kind::Text => Body::Text(decode_text(&mut r, bufs.take_text())?),
        Kind::Notice => Body::Notice(decode_notice(&mut r)?),
    };
    r.finish()?;
    Ok(Frame { header, body })
}

/// The record vectors of provenance and text frames, kept empty between
/// frames so that decoding a frame allocates no memory
/// ([`decode_reusing`]).
#[derive(Debug, Default)]
pub struct RecordBufs {
    prov: Vec<ProvRecord<'static>>,
    text: Vec<TextRecord<'static>>,
}

/// An empty vector with `v`'s allocation for records of another lifetime.
/// No element is ever mapped; collecting a `vec::IntoIter` of a type with
/// the same size and alignment reuses its buffer (`std`'s in-place collect;
/// `record_bufs_reuse_the_allocation` checks it), and were that to change
/// the result would only be a fresh allocation.
#[inline]
fn relifetime<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().map(|_| unreachable!()).collect()
}

impl RecordBufs {
    #[inline]
    fn take_prov<'a>(&mut self) -> Vec<ProvRecord<'a>> {
        relifetime(std::mem::take(&mut self.prov))
    }

    #[inline]
    fn take_text<'a>(&mut self) -> Vec<TextRecord<'a>> {
        relifetime(std::mem::take(&mut self.text))
    }

    /// Keep a decoded body's record vector for the next frame.
    #[inline]
    pub fn recycle(&mut self, body: Body<'_>) {
        match body {
            Body::Provenance(v) => self.prov = relifetime(v),
            Body::Text(v) => self.text = relifetime(v),
            Body::Hello(_) | Body::Notice(_) => {}
        }
    }

    /// Bytes of capacity kept (for tests).
    #[cfg(test)]
    fn capacities(&self) -> (usize, usize) {
        (self.prov.capacity(), self.text.capacity())
    }
}

#[cfg(test)]
mod tests {
    use super::records::check_roles;
    use super::*;

    fn header(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(b"PHUE");
        v.push(3);
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

    /// Frames of a generated run (hello, provenance, text, several
    /// sources) and, per frame, corrupted copies: one to three bytes set at
    /// random places (inclusive `Rng::range`), a truncation, a byte appended (header length fixed up in
    /// half of the corrupted copies so that body errors are reached).
    fn frames_and_corruptions() -> Vec<Vec<u8>> {
        use crate::workload::{generate, Rng, WorkloadConfig};
        let w = generate(&WorkloadConfig {
            streams: 9,
            tokens_per_stream: 120,
            k: 4,
            coalesce: 1,
            seed: 20261202,
        });
        let mut rng = Rng(7);
        let mut out = Vec::new();
        for f in w.frames() {
            out.push(f.to_vec());
            for i in 0..6u64 {
                let mut g = f.to_vec();
                match i {
                    0..=3 => {
                        for _ in 0..=rng.range(0, 2) {
                            let at = rng.range(0, g.len() as u64 - 1) as usize;
                            g[at] = rng.range(0, 255) as u8;
                        }
                    }
                    4 => g.truncate(rng.range(HEADER_LEN as u64, g.len() as u64 - 1) as usize),
                    _ => g.push(rng.range(0, 255) as u8),
                }
                if i % 2 == 1 && g.len() >= HEADER_LEN {
                    let body = (g.len() - HEADER_LEN) as u32;
                    g[60..64].copy_from_slice(&body.to_le_bytes());
                }
                out.push(g);
            }
        }
        out
    }

    #[test]
    fn decode_reusing_equals_decode() {
        let frames = frames_and_corruptions();
        let mut bufs = RecordBufs::default();
        let (mut ok, mut errors) = (0, std::collections::HashSet::new());
        let mut kinds = std::collections::BTreeSet::new();
        for f in &frames {
            let fresh = decode(f);
            let reused = decode_reusing(f, &mut bufs);
            assert_eq!(fresh, reused, "frame {f:02x?}");
            match reused {
                Ok(frame) => {
                    ok += 1;
                    kinds.insert(frame.header.kind.name());
                    bufs.recycle(frame.body);
                }
                Err(e) => {
                    assert_eq!(fresh.unwrap_err().to_string(), e.to_string());
                    errors.insert(std::mem::discriminant(&e));
                }
            }
        }
        // Both ways were exercised: valid frames of every kind decoded on a
        // kept vector, and many kinds of error (body errors among them).
        assert!(ok > 200, "{ok} frames decoded of {}", frames.len());
        assert!(errors.len() >= 15, "{} kinds of error", errors.len());
        assert_eq!(
            kinds.into_iter().collect::<Vec<_>>(),
            ["hello", "provenance", "text"]
        );
    }

    #[test]
    fn record_bufs_reuse_the_allocation() {
        use crate::encode::{text_body, TextRec};
        let recs = |n: u16| -> Vec<TextRec> {
            (0..n)
                .map(|stream| TextRec {
                    stream,
                    offset: 0,
                    tokens: vec![crate::encode::TextTok {
                        token_id: 5,
                        fragment: b"ab".to_vec(),
                        span_back: 0,
                        lead_len: 0,
                    }],
                    http: b"ab".to_vec(),
                    ..TextRec::default()
                })
                .collect()
        };
        let big = header(3, &text_body(&recs(20)));
        let small = header(3, &text_body(&recs(3)));
        let mut bufs = RecordBufs::default();
        let frame = decode_reusing(&big, &mut bufs).unwrap();
        let Body::Text(v) = &frame.body else {
            panic!("not text")
        };
        let (ptr, cap) = (v.as_ptr() as usize, v.capacity());
        assert!(cap >= 20);
        bufs.recycle(frame.body);
        assert_eq!(bufs.capacities(), (0, cap));
        for data in [&small, &big, &small] {
            let frame = decode_reusing(data, &mut bufs).unwrap();
            assert_eq!(frame, decode(data).unwrap());
            let Body::Text(v) = &frame.body else {
                panic!("not text")
            };
            assert_eq!((v.as_ptr() as usize, v.capacity()), (ptr, cap));
            bufs.recycle(frame.body);
        }
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
        f[4] = 2;
        assert_eq!(
            decode(&f).unwrap_err().to_string(),
            "unsupported protocol version 2 (this build speaks 3)"
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

    /// A provenance body of one-token plain records for `streams`, in order.
    fn provenance_body(streams: &[u16]) -> Vec<u8> {
        let mut b = (streams.len() as u16).to_le_bytes().to_vec();
        for &s in streams {
            b.extend_from_slice(&s.to_le_bytes());
            b.extend_from_slice(&[0, 0]); // flags, finish_reason
            b.extend_from_slice(&0u32.to_le_bytes()); // offset
            b.extend_from_slice(&1u16.to_le_bytes()); // n
            b.extend_from_slice(&[0; 4]); // drafts scheduled, padded
            b.extend_from_slice(&9u32.to_le_bytes()); // token id
            b.push(ROLE_PLAIN);
        }
        b
    }

    #[test]
    fn repeated_and_reserved_streams_in_any_order() {
        let result = |streams: &[u16]| match decode(&header(2, &provenance_body(streams))) {
            Ok(Frame {
                body: Body::Provenance(recs),
                ..
            }) => Ok(recs.iter().map(|r| r.stream).collect::<Vec<_>>()),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e.to_string()),
        };
        let twice = |s: u16| Err(format!("stream {s} appears twice in one frame"));
        let reserved = Err("stream 65535 is reserved".to_owned());
        assert_eq!(
            result(&[0, 1, 63, 64, 65534]),
            Ok(vec![0, 1, 63, 64, 65534])
        );
        assert_eq!(result(&[5, 2, 9, 3]), Ok(vec![5, 2, 9, 3]));
        assert_eq!(result(&[1, 2, 1]), twice(1));
        assert_eq!(result(&[7, 7]), twice(7));
        assert_eq!(result(&[3, 1, 2, 3]), twice(3));
        assert_eq!(result(&[4, 1, 5, 4]), twice(4));
        assert_eq!(result(&[65535]), reserved);
        assert_eq!(result(&[2, 65535]), reserved);
        assert_eq!(result(&[65535, 65535]), reserved);
        assert_eq!(result(&[9, 1, 65535]), reserved);
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

    /// A body cut anywhere reports the datagram offset where the field that
    /// ran out starts, for every cut of a two-record provenance and text
    /// body, and a whole body decodes.
    #[test]
    fn a_cut_body_reports_the_field_that_ran_out() {
        use crate::encode::{provenance_body, text_body, ProvRec, TextRec, TextTok};
        let prov = |stream, offset| ProvRec {
            stream,
            flags: 0,
            finish_reason: 0,
            offset,
            drafts_scheduled: 2,
            drafts_padded: 0,
            token_ids: vec![5, 6],
            roles: vec![ROLE_ACCEPTED, ROLE_TARGET],
        };
        let tok = |token_id, fragment: &str| TextTok {
            token_id,
            fragment: fragment.as_bytes().to_vec(),
            span_back: 0,
            lead_len: 0,
        };
        let text = |stream, offset| TextRec {
            stream,
            flags: 0,
            finish_reason: 0,
            offset,
            trimmed_tokens: 0,
            tokens: vec![tok(5, "ab"), tok(6, "\u{e9}")],
            http: "ab\u{e9}".as_bytes().to_vec(),
        };
        // Field sizes of one record, in order.
        let p_fields = [2, 1, 1, 4, 2, 2, 2, 8, 2];
        let t_fields = [2, 1, 1, 4, 2, 2, 4, 18, 4, 4];
        for (kind, name, body, fields) in [
            (
                2,
                "provenance",
                provenance_body(&[prov(1, 0), prov(4, 9)]),
                &p_fields[..],
            ),
            (
                3,
                "text",
                text_body(&[text(1, 0), text(4, 9)]),
                &t_fields[..],
            ),
        ] {
            // The count, then each record's fields: where each starts.
            let mut starts = vec![0usize];
            let mut at = 2;
            for _ in 0..2 {
                for f in fields {
                    starts.push(at);
                    at += f;
                }
            }
            assert_eq!(at, body.len(), "{name}: the layout of the test");
            assert!(decode(&header(kind, &body)).is_ok());
            for cut in 0..body.len() {
                let field = starts.iter().rev().find(|&&s| s <= cut).unwrap();
                let pos = HEADER_LEN + field;
                assert_eq!(
                    decode(&header(kind, &body[..cut])).unwrap_err().to_string(),
                    format!("truncated {name} body at byte {pos}"),
                    "{name} cut at {cut}"
                );
            }
        }
    }
}
