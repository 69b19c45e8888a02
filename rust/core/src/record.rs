//! The recording format (version 3): the ordered inputs a reconciler applied,
//! with their times, between a header and a footer.
//!
//! A recording is a gzip stream of items. Each item is
//! `kind: u8, payload length: u32 LE, time: f64 LE (seconds since the
//! recording began), payload`, after a 6-byte preamble `PHREC` + version.
//! The header and footer payloads are JSON objects written by the client;
//! everything else is binary, so the tap costs a copy, not a serialization.
//! docs/CLIENT.md ("Record, replay") describes the items.
//!
//! [`encode_item`] and [`decode_items`] are the one encoder and decoder: the
//! Rust tap ([`crate::tap`]), the Python reference path (through the binding)
//! and `parallelhue replay` all use them.

use std::fmt;

/// `PHREC` then the format version.
pub const MAGIC: &[u8; 5] = b"PHREC";
pub const FORMAT_VERSION: u8 = 4;
/// Bytes of the item head: kind, payload length, time.
pub const ITEM_HEAD: usize = 1 + 4 + 8;

/// Item kinds, as stored.
pub mod kind {
    pub const HEADER: u8 = 1;
    pub const START: u8 = 2;
    pub const SSE: u8 = 3;
    pub const FINISH: u8 = 4;
    pub const END: u8 = 5;
    pub const FRAME: u8 = 6;
    pub const REJECT: u8 = 7;
    pub const FINALIZE: u8 = 8;
    pub const FOOTER: u8 = 9;
    pub const SSE_ID: u8 = 10;
    pub const SSE_CHOICE: u8 = 11;
    pub const SSE_USAGE: u8 = 12;
    pub const LOST: u8 = 13;
    pub const STREAM_LOST: u8 = 14;
    pub const SSE_COUNTS: u8 = 15;
}

/// One recorded item. Reconciler inputs are `Sse`, `SseId`, `SseChoice`,
/// `SseUsage`, `Finish`, `Frame`, `Reject`, `Lost` and `Finalize`; `Start` and `End` say when a stream's request
/// began and how it ended when not normally (for the screen and the summary);
/// `SseCounts` feeds the server-reported tier only.
#[derive(Clone, Debug, PartialEq)]
pub enum Item<'a> {
    Header(&'a str),
    Start {
        stream: u16,
    },
    Sse {
        stream: u16,
        text: &'a str,
        /// Little-endian u32 token ids.
        ids: &'a [u8],
    },
    /// A chunk id (`push_sse_id`).
    SseId {
        stream: u16,
        id: &'a str,
    },
    /// A choice other than the single choice 0 (`push_sse_choice`).
    SseChoice {
        stream: u16,
        index: u32,
    },
    /// The usage (`push_sse_usage`); the per-step lists as little-endian u32s.
    SseUsage {
        stream: u16,
        completion_tokens: Option<u64>,
        accepted: Option<&'a [u8]>,
        drafted: Option<&'a [u8]>,
    },
    /// Step counters of a stock server (an `SseInput::Counts`): `kind` is a
    /// `CountsKind` code; no reconciler reads them (the server-reported tier does).
    SseCounts {
        stream: u16,
        kind: u8,
        values: [Option<u64>; 3],
    },
    Finish {
        stream: u16,
        reason: Option<&'a str>,
    },
    End {
        stream: u16,
        /// One of [`crate::outcome::EndKind`]'s codes.
        code: u8,
        status: u16,
        detail: &'a str,
    },
    Frame(&'a [u8]),
    Reject(&'a str),
    /// Telemetry lost on the way to the client (`Reconciler::push_lost`):
    /// frames the server's hub dropped, None when its stream ended early.
    Lost {
        frames: Option<u64>,
    },
    /// A stream's in-band telemetry missing frames (`Reconciler::push_stream_lost`).
    StreamLost {
        stream: u16,
        reason: &'a str,
    },
    Finalize,
    Footer(&'a str),
}

impl Item<'_> {
    /// The token ids of an `Sse` item.
    pub fn token_ids(ids: &[u8]) -> impl ExactSizeIterator<Item = u32> + '_ {
        ids.chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// The 6-byte preamble of a recording.
pub fn preamble() -> [u8; 6] {
    [
        MAGIC[0],
        MAGIC[1],
        MAGIC[2],
        MAGIC[3],
        MAGIC[4],
        FORMAT_VERSION,
    ]
}

fn head(out: &mut Vec<u8>, kind: u8, len: usize, at: f64) {
    out.push(kind);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&at.to_le_bytes());
}

/// Append one item to `out`.
pub fn encode_item(out: &mut Vec<u8>, at: f64, item: &Item<'_>) {
    match item {
        Item::Header(json) => {
            head(out, kind::HEADER, json.len(), at);
            out.extend_from_slice(json.as_bytes());
        }
        Item::Footer(json) => {
            head(out, kind::FOOTER, json.len(), at);
            out.extend_from_slice(json.as_bytes());
        }
        Item::Start { stream } => {
            head(out, kind::START, 2, at);
            out.extend_from_slice(&stream.to_le_bytes());
        }
        Item::Sse { stream, text, ids } => {
            head(out, kind::SSE, 2 + 4 + ids.len() + text.len(), at);
            out.extend_from_slice(&stream.to_le_bytes());
            out.extend_from_slice(&((ids.len() / 4) as u32).to_le_bytes());
            out.extend_from_slice(ids);
            out.extend_from_slice(text.as_bytes());
        }
        Item::SseId { stream, id } => {
            head(out, kind::SSE_ID, 2 + id.len(), at);
            out.extend_from_slice(&stream.to_le_bytes());
            out.extend_from_slice(id.as_bytes());
        }
        Item::SseChoice { stream, index } => {
            head(out, kind::SSE_CHOICE, 6, at);
            out.extend_from_slice(&stream.to_le_bytes());
            out.extend_from_slice(&index.to_le_bytes());
        }
        Item::SseUsage {
            stream,
            completion_tokens,
            accepted,
            drafted,
        } => {
            // stream, presence bits (completion_tokens, accepted, drafted),
            // completion_tokens u64, then each list as u32 count + u32s.
            let list_len = |l: &Option<&[u8]>| l.map_or(0, |b| b.len());
            let len = 2 + 1 + 8 + 4 + list_len(accepted) + 4 + list_len(drafted);
            head(out, kind::SSE_USAGE, len, at);
            out.extend_from_slice(&stream.to_le_bytes());
            let bits = u8::from(completion_tokens.is_some())
                | u8::from(accepted.is_some()) << 1
                | u8::from(drafted.is_some()) << 2;
            out.push(bits);
            out.extend_from_slice(&completion_tokens.unwrap_or(0).to_le_bytes());
            for list in [accepted, drafted] {
                let b = list.unwrap_or(&[]);
                out.extend_from_slice(&((b.len() / 4) as u32).to_le_bytes());
                out.extend_from_slice(b);
            }
        }
        Item::SseCounts {
            stream,
            kind,
            values,
        } => {
            // stream, kind, presence bits (one per value), then three u64s.
            head(out, kind::SSE_COUNTS, 2 + 1 + 1 + 24, at);
            out.extend_from_slice(&stream.to_le_bytes());
            out.push(*kind);
            let bits = values
                .iter()
                .enumerate()
                .fold(0u8, |b, (i, v)| b | u8::from(v.is_some()) << i);
            out.push(bits);
            for v in values {
                out.extend_from_slice(&v.unwrap_or(0).to_le_bytes());
            }
        }
        Item::Finish { stream, reason } => {
            let r = reason.unwrap_or("");
            head(out, kind::FINISH, 3 + r.len(), at);
            out.extend_from_slice(&stream.to_le_bytes());
            out.push(u8::from(reason.is_some()));
            out.extend_from_slice(r.as_bytes());
        }
        Item::End {
            stream,
            code,
            status,
            detail,
        } => {
            head(out, kind::END, 5 + detail.len(), at);
            out.extend_from_slice(&stream.to_le_bytes());
            out.push(*code);
            out.extend_from_slice(&status.to_le_bytes());
            out.extend_from_slice(detail.as_bytes());
        }
        Item::Frame(data) => {
            head(out, kind::FRAME, data.len(), at);
            out.extend_from_slice(data);
        }
        Item::Reject(reason) => {
            head(out, kind::REJECT, reason.len(), at);
            out.extend_from_slice(reason.as_bytes());
        }
        Item::Lost { frames } => {
            head(out, kind::LOST, 9, at);
            out.push(u8::from(frames.is_some()));
            out.extend_from_slice(&frames.unwrap_or(0).to_le_bytes());
        }
        Item::StreamLost { stream, reason } => {
            head(out, kind::STREAM_LOST, 2 + reason.len(), at);
            out.extend_from_slice(&stream.to_le_bytes());
            out.extend_from_slice(reason.as_bytes());
        }
        Item::Finalize => head(out, kind::FINALIZE, 0, at),
    }
}

/// Append an `Sse` item from token ids as numbers.
pub fn encode_sse(out: &mut Vec<u8>, at: f64, stream: u16, text: &str, ids: &[u32]) {
    head(out, kind::SSE, 2 + 4 + 4 * ids.len() + text.len(), at);
    out.extend_from_slice(&stream.to_le_bytes());
    out.extend_from_slice(&(ids.len() as u32).to_le_bytes());
    for id in ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
    out.extend_from_slice(text.as_bytes());
}

/// Little-endian u32s, as the items store token ids and per-step counts.
pub fn u32_bytes(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A recording (or a buffer of items) that cannot be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordError {
    /// The data does not start with the preamble.
    NotARecording,
    /// The preamble of another format version.
    Version(u8),
    /// The data ends inside an item that starts at `offset`.
    Truncated { offset: usize },
    /// An item whose payload does not fit its kind.
    BadItem {
        offset: usize,
        kind: u8,
        why: &'static str,
    },
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::NotARecording => f.write_str("not a ParallelHue recording"),
            RecordError::Version(v) => write!(
                f,
                "recording format {v}, this build reads {FORMAT_VERSION}: record the run again"
            ),
            RecordError::Truncated { offset } => {
                write!(
                    f,
                    "the recording is cut short inside the item at byte {offset}"
                )
            }
            RecordError::BadItem { offset, kind, why } => {
                write!(f, "invalid item of kind {kind} at byte {offset}: {why}")
            }
        }
    }
}

impl std::error::Error for RecordError {}

/// Check the preamble; the items start after it.
pub fn check_preamble(data: &[u8]) -> Result<&[u8], RecordError> {
    if data.len() < 6 || &data[..5] != MAGIC {
        return Err(RecordError::NotARecording);
    }
    if data[5] != FORMAT_VERSION {
        return Err(RecordError::Version(data[5]));
    }
    Ok(&data[6..])
}

fn u16_at(p: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([p[i], p[i + 1]])
}

#[inline(always)]
fn text(p: &[u8], offset: usize, kind: u8) -> Result<&str, RecordError> {
    if p.is_ascii() {
        // SAFETY: ASCII is valid UTF-8. (Most deltas are a few ASCII bytes,
        // where the general check costs more than the item's decoding.)
        return Ok(unsafe { std::str::from_utf8_unchecked(p) });
    }
    std::str::from_utf8(p).map_err(|_| RecordError::BadItem {
        offset,
        kind,
        why: "text is not UTF-8",
    })
}

/// A table on purpose: one arm per item kind of the recording format (long by design).
#[inline(always)]
fn decode_one(kind: u8, p: &[u8], offset: usize) -> Result<Item<'_>, RecordError> {
    let bad = |why| RecordError::BadItem { offset, kind, why };
    let need = |n: usize| {
        if p.len() < n {
            Err(bad("payload too short"))
        } else {
            Ok(())
        }
    };
    Ok(match kind {
        kind::HEADER => Item::Header(text(p, offset, kind)?),
        kind::FOOTER => Item::Footer(text(p, offset, kind)?),
        kind::START => {
            need(2)?;
            Item::Start {
                stream: u16_at(p, 0),
            }
        }
        kind::SSE => {
            need(6)?;
            let n = u32::from_le_bytes([p[2], p[3], p[4], p[5]]) as usize;
            let ids_end = n
                .checked_mul(4)
                .and_then(|b| b.checked_add(6))
                .ok_or_else(|| bad("too many token ids"))?;
            need(ids_end)?;
            Item::Sse {
                stream: u16_at(p, 0),
                ids: &p[6..ids_end],
                text: text(&p[ids_end..], offset, kind)?,
            }
        }
        kind::SSE_ID => {
            need(2)?;
            Item::SseId {
                stream: u16_at(p, 0),
                id: text(&p[2..], offset, kind)?,
            }
        }
        kind::SSE_CHOICE => {
            need(6)?;
            Item::SseChoice {
                stream: u16_at(p, 0),
                index: u32::from_le_bytes([p[2], p[3], p[4], p[5]]),
            }
        }
        kind::SSE_USAGE => {
            need(15)?;
            let bits = p[2];
            if bits > 7 {
                return Err(bad("unknown usage bits"));
            }
            let mut n8 = [0u8; 8];
            n8.copy_from_slice(&p[3..11]);
            let mut at = 11;
            let mut lists = [None, None];
            for (i, list) in lists.iter_mut().enumerate() {
                need(at + 4)?;
                let n = u32::from_le_bytes([p[at], p[at + 1], p[at + 2], p[at + 3]]) as usize;
                let end = n
                    .checked_mul(4)
                    .and_then(|b| b.checked_add(at + 4))
                    .ok_or_else(|| bad("too many counts"))?;
                need(end)?;
                if bits & (2 << i) != 0 {
                    *list = Some(&p[at + 4..end]);
                } else if n != 0 {
                    return Err(bad("counts of an absent list"));
                }
                at = end;
            }
            if at != p.len() {
                return Err(bad("payload too long"));
            }
            Item::SseUsage {
                stream: u16_at(p, 0),
                completion_tokens: (bits & 1 != 0).then_some(u64::from_le_bytes(n8)),
                accepted: lists[0],
                drafted: lists[1],
            }
        }
        kind::SSE_COUNTS => {
            need(28)?;
            if p.len() != 28 {
                return Err(bad("payload too long"));
            }
            if crate::sse::inputs::CountsKind::from_code(p[2]).is_none() {
                return Err(bad("unknown counts kind"));
            }
            let bits = p[3];
            if bits > 7 {
                return Err(bad("unknown count bits"));
            }
            let mut values = [None; 3];
            for (i, v) in values.iter_mut().enumerate() {
                let at = 4 + 8 * i;
                let n = u64::from_le_bytes(
                    p[at..at + 8]
                        .try_into()
                        .map_err(|_| bad("payload too short"))?,
                );
                *v = (bits & (1 << i) != 0).then_some(n);
            }
            Item::SseCounts {
                stream: u16_at(p, 0),
                kind: p[2],
                values,
            }
        }
        kind::FINISH => {
            need(3)?;
            let reason = text(&p[3..], offset, kind)?;
            Item::Finish {
                stream: u16_at(p, 0),
                reason: match p[2] {
                    0 => None,
                    _ => Some(reason),
                },
            }
        }
        kind::END => {
            need(5)?;
            Item::End {
                stream: u16_at(p, 0),
                code: p[2],
                status: u16_at(p, 3),
                detail: text(&p[5..], offset, kind)?,
            }
        }
        kind::FRAME => Item::Frame(p),
        kind::REJECT => Item::Reject(text(p, offset, kind)?),
        kind::LOST => {
            need(9)?;
            let count =
                u64::from_le_bytes(p[1..9].try_into().map_err(|_| bad("payload too short"))?);
            Item::Lost {
                frames: (p[0] != 0).then_some(count),
            }
        }
        kind::STREAM_LOST => {
            need(2)?;
            Item::StreamLost {
                stream: u16_at(p, 0),
                reason: text(&p[2..], offset, kind)?,
            }
        }
        kind::FINALIZE => Item::Finalize,
        _ => return Err(bad("unknown kind")),
    })
}

/// Decode items (no preamble) in order; `f(time, item)` for each. Stops at
/// the first error, after the items before it.
pub fn decode_items<'a>(
    data: &'a [u8],
    mut f: impl FnMut(f64, Item<'a>),
) -> Result<(), RecordError> {
    let mut at = 0;
    while at < data.len() {
        if data.len() - at < ITEM_HEAD {
            return Err(RecordError::Truncated { offset: at });
        }
        let kind = data[at];
        let len =
            u32::from_le_bytes([data[at + 1], data[at + 2], data[at + 3], data[at + 4]]) as usize;
        let mut t = [0u8; 8];
        t.copy_from_slice(&data[at + 5..at + 13]);
        let time = f64::from_le_bytes(t);
        let start = at + ITEM_HEAD;
        if data.len() - start < len {
            return Err(RecordError::Truncated { offset: at });
        }
        let item = decode_one(kind, &data[start..start + len], at)?;
        f(time, item);
        at = start + len;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_items() -> Vec<(f64, Vec<u8>)> {
        let ids: Vec<u8> = [5u32, 70000].iter().flat_map(|i| i.to_le_bytes()).collect();
        let items = [
            Item::Header("{\"a\":1}"),
            Item::Start { stream: 3 },
            Item::Sse {
                stream: 3,
                text: "h\u{e9}",
                ids: &ids,
            },
            Item::SseId {
                stream: 3,
                id: "chatcmpl-ph1_x_3",
            },
            Item::SseChoice {
                stream: 3,
                index: 70000,
            },
            Item::SseUsage {
                stream: 3,
                completion_tokens: Some(9),
                accepted: Some(&ids),
                drafted: None,
            },
            Item::SseUsage {
                stream: 3,
                completion_tokens: None,
                accepted: None,
                drafted: Some(&ids[..4]),
            },
            Item::SseCounts {
                stream: 3,
                kind: 1,
                values: [Some(12), None, Some(u64::MAX)],
            },
            Item::Finish {
                stream: 3,
                reason: Some("stop"),
            },
            Item::Finish {
                stream: 2,
                reason: None,
            },
            Item::End {
                stream: 1,
                code: 7,
                status: 500,
                detail: "boom",
            },
            Item::Frame(b"PHUE\x01"),
            Item::Reject("oversized"),
            Item::Lost { frames: Some(7) },
            Item::Lost { frames: None },
            Item::StreamLost {
                stream: 3,
                reason: "telemetry lost: x",
            },
            Item::Finalize,
            Item::Footer("{}"),
        ];
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let mut out = Vec::new();
                encode_item(&mut out, i as f64 * 0.5, item);
                (i as f64 * 0.5, out)
            })
            .collect()
    }

    #[test]
    fn every_item_round_trips() {
        let encoded = all_items();
        let mut data = Vec::new();
        for (_, bytes) in &encoded {
            data.extend_from_slice(bytes);
        }
        let mut seen = Vec::new();
        decode_items(&data, |t, item| {
            let mut again = Vec::new();
            encode_item(&mut again, t, &item);
            seen.push((t, again));
        })
        .unwrap();
        assert_eq!(seen, encoded);
        // encode_sse is encode_item of the same ids.
        let ids: Vec<u8> = [5u32, 70000].iter().flat_map(|i| i.to_le_bytes()).collect();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        encode_sse(&mut a, 1.0, 3, "h\u{e9}", &[5, 70000]);
        let item = Item::Sse {
            stream: 3,
            text: "h\u{e9}",
            ids: &ids,
        };
        encode_item(&mut b, 1.0, &item);
        assert_eq!(a, b);
        assert_eq!(Item::token_ids(&ids).collect::<Vec<_>>(), vec![5, 70000]);
    }

    #[test]
    fn cut_and_bad_items_are_precise_errors() {
        let (_, sse) = &all_items()[2];
        for cut in 1..sse.len() {
            assert_eq!(
                decode_items(&sse[..cut], |_, _| {}),
                Err(RecordError::Truncated { offset: 0 }),
                "cut {cut}"
            );
        }
        let mut bad = sse.clone();
        bad[0] = 77;
        assert_eq!(
            decode_items(&bad, |_, _| {}).unwrap_err().to_string(),
            "invalid item of kind 77 at byte 0: unknown kind"
        );
        // An SSE item claiming more ids than it holds.
        let mut bad = sse.clone();
        bad[ITEM_HEAD + 2] = 200;
        assert_eq!(
            decode_items(&bad, |_, _| {}).unwrap_err().to_string(),
            "invalid item of kind 3 at byte 0: payload too short"
        );
        // A lost item shorter than its 9 bytes.
        let mut short = Vec::new();
        head(&mut short, kind::LOST, 8, 0.0);
        short.extend_from_slice(&[1, 2, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            decode_items(&short, |_, _| {}).unwrap_err().to_string(),
            "invalid item of kind 13 at byte 0: payload too short"
        );
        // A counts item with a presence bit beyond its three values, and one too long.
        let (_, counts) = &all_items()[7];
        let mut bad = counts.clone();
        bad[ITEM_HEAD + 3] = 8;
        assert_eq!(
            decode_items(&bad, |_, _| {}).unwrap_err().to_string(),
            "invalid item of kind 15 at byte 0: unknown count bits"
        );
        let mut unknown = counts.clone();
        unknown[ITEM_HEAD + 2] = 3;
        assert_eq!(
            decode_items(&unknown, |_, _| {}).unwrap_err().to_string(),
            "invalid item of kind 15 at byte 0: unknown counts kind"
        );
        let mut long = Vec::new();
        head(&mut long, kind::SSE_COUNTS, 29, 0.0);
        long.extend_from_slice(&[0, 0, 1]);
        long.extend_from_slice(&[0; 26]);
        assert_eq!(
            decode_items(&long, |_, _| {}).unwrap_err().to_string(),
            "invalid item of kind 15 at byte 0: payload too long"
        );
        assert_eq!(
            check_preamble(b"PHREC\x02rest"),
            Err(RecordError::Version(2))
        );
        assert_eq!(check_preamble(b"{\"x\""), Err(RecordError::NotARecording));
        assert_eq!(check_preamble(&preamble()).unwrap(), b"");
    }
}
