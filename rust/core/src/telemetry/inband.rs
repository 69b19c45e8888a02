//! In-band telemetry (docs/PROTOCOL.md, "In-band telemetry"): the data of an
//! `event: parallelhue` SSE event, decoded into frames and the end item.
//!
//! The reference is `parallelhue_vllm.inband.decode_event` (and `lost_reason`):
//! the same data gives the same items, the same refusals with the same
//! messages and the same reasons (`tests/test_sse_body.py` holds them equal).

/// The SSE event type that carries in-band telemetry.
pub const EVENT_NAME: &str = "parallelhue";
/// A frame item's payload at most (a whole telemetry frame).
pub const MAX_FRAME_ITEM: usize = 65_536;
const ITEM_FRAME: u8 = 1;
const ITEM_END: u8 = 2;
const END_LEN: usize = 16;
/// End item statuses (docs/PROTOCOL.md).
pub const STATUS_COMPLETE: u16 = 0;
pub const STATUS_DROPPED: u16 = 4;

/// The end item of a response's telemetry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct End {
    pub status: u16,
    /// Frame items the response carried before it.
    pub frames: u32,
    pub dropped: u32,
    /// How long the server's end of stream waited; the server's statement only.
    pub waited_us: u32,
}

/// One item of an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    Frame(Vec<u8>),
    End(End),
}

/// The items of one event's data; the error is the normative message.
pub fn decode_event(data: &str) -> Result<Vec<Item>, String> {
    let raw = decode_base64(data).ok_or("in-band telemetry: event data is not base64")?;
    let mut items = Vec::new();
    let mut at = 0;
    while at < raw.len() {
        let left = raw.len() - at;
        if left < 5 {
            return Err(format!(
                "in-band telemetry: truncated item header at byte {at}: {left} of 5 bytes"
            ));
        }
        let kind = raw[at];
        let len = u32::from_le_bytes([raw[at + 1], raw[at + 2], raw[at + 3], raw[at + 4]]) as usize;
        match kind {
            ITEM_FRAME if !(1..=MAX_FRAME_ITEM).contains(&len) => {
                return Err(format!(
                "in-band telemetry: frame item at byte {at} of {len} bytes (1..={MAX_FRAME_ITEM})"
            ))
            }
            ITEM_END if len != END_LEN => {
                return Err(format!(
                    "in-band telemetry: end item at byte {at} of {len} bytes (exactly {END_LEN})"
                ))
            }
            ITEM_FRAME | ITEM_END => {}
            other => {
                return Err(format!(
                    "in-band telemetry: unknown item type {other} at byte {at}"
                ))
            }
        }
        let start = at + 5;
        let have = raw.len() - start;
        if have < len {
            return Err(format!(
                "in-band telemetry: truncated item at byte {at}: {have} of {len} bytes"
            ));
        }
        let payload = &raw[start..start + len];
        if kind == ITEM_FRAME {
            items.push(Item::Frame(payload.to_vec()));
        } else {
            let u16_at = |i: usize| u16::from_le_bytes([payload[i], payload[i + 1]]);
            let u32_at = |i: usize| {
                u32::from_le_bytes([payload[i], payload[i + 1], payload[i + 2], payload[i + 3]])
            };
            let reserved = u16_at(2);
            if reserved != 0 {
                return Err(format!(
                    "in-band telemetry: end item at byte {at}: reserved {reserved}"
                ));
            }
            items.push(Item::End(End {
                status: u16_at(0),
                frames: u32_at(4),
                dropped: u32_at(8),
                waited_us: u32_at(12),
            }));
        }
        at = start + len;
    }
    Ok(items)
}

/// The reconciler's reason when an end item says telemetry is missing (None:
/// nothing is). The numbers are the server's; they only word the reason.
pub fn lost_reason(end: &End) -> Option<String> {
    let waited = format!("{} ms", end.waited_us / 1000);
    Some(match end.status {
        STATUS_COMPLETE => return None,
        1 => format!(
            "telemetry lost: the scheduler's frames of the final step did not come within {waited}"
        ),
        2 => format!(
            "telemetry lost: the detokenizer's frames of the final step did not come within {waited}"
        ),
        3 => format!("telemetry lost: no frame of the final step came within {waited}"),
        STATUS_DROPPED => format!(
            "telemetry lost: {} frames dropped by the server (the response was read too slowly)",
            end.dropped
        ),
        5 => "telemetry lost: the server's telemetry hub shut down".to_owned(),
        other => format!(
            "telemetry lost: the server ended this response's telemetry with status {other}"
        ),
    })
}

/// Where a response's in-band telemetry stands (one per stream).
#[derive(Clone, Debug, Default)]
pub struct InbandState {
    seen: bool,
    ended: bool,
    frames: u64,
}

/// What one event gives: frames (in order), then maybe the reason the
/// stream's telemetry is lost.
pub enum Given {
    Frame(Vec<u8>),
    Lost(String),
}

/// The reason when the response ends with in-band telemetry begun but no end item.
pub const ENDED_EARLY: &str = "telemetry lost: the response ended before its in-band telemetry did";

impl InbandState {
    /// One `parallelhue` event: its items, checked against what came before.
    pub fn event(&mut self, data: &str, out: &mut impl FnMut(Given)) -> Result<(), String> {
        if self.ended {
            return Err("in-band telemetry: an event after its end item".to_owned());
        }
        self.seen = true;
        for item in decode_event(data)? {
            if self.ended {
                return Err("in-band telemetry: an event after its end item".to_owned());
            }
            match item {
                Item::Frame(frame) => {
                    self.frames += 1;
                    out(Given::Frame(frame));
                }
                Item::End(end) => {
                    if u64::from(end.frames) != self.frames {
                        return Err(format!(
                            "in-band telemetry: the end item counts {} frames, {} came",
                            end.frames, self.frames
                        ));
                    }
                    if (end.status == STATUS_DROPPED) != (end.dropped > 0) {
                        return Err(format!(
                            "in-band telemetry: end item status {} with {} frames dropped",
                            end.status, end.dropped
                        ));
                    }
                    self.ended = true;
                    if let Some(reason) = lost_reason(&end) {
                        out(Given::Lost(reason));
                    }
                }
            }
        }
        Ok(())
    }

    /// The body ended normally: telemetry begun and not ended is lost.
    pub fn body_ended(&mut self) -> Option<&'static str> {
        (self.seen && !self.ended).then(|| {
            self.ended = true;
            ENDED_EARLY
        })
    }
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding, strictly: non-empty, a multiple of 4, only
/// the alphabet with at most two `=` at the end, and the canonical spelling
/// (unused bits zero), as the reference's `b64decode(validate=True)` plus its
/// re-encoding check accept it.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    if bytes.is_empty() || !bytes.len().is_multiple_of(4) {
        return None;
    }
    let pad = bytes.iter().rev().take_while(|&&b| b == b'=').count();
    if pad > 2 {
        return None;
    }
    let body = &bytes[..bytes.len() - pad];
    let mut values = Vec::with_capacity(body.len());
    for &b in body {
        values.push(ALPHABET.iter().position(|&a| a == b)? as u32);
    }
    let mut out = Vec::with_capacity(values.len() * 3 / 4);
    for quad in values.chunks(4) {
        let mut acc = 0u32;
        for (i, v) in quad.iter().enumerate() {
            acc |= v << (18 - 6 * i);
        }
        let take = match quad.len() {
            4 => 3,
            3 => 2,
            2 => 1,
            _ => return None,
        };
        let unused = match quad.len() {
            3 => acc & 0xFF,
            2 => acc & 0xFFFF,
            _ => 0,
        };
        if unused != 0 {
            return None; // a second spelling of the same bytes
        }
        for i in 0..take {
            out.push((acc >> (16 - 8 * i)) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn base64_is_strict_and_canonical() {
        assert_eq!(decode_base64("QQ=="), Some(b"A".to_vec()));
        assert_eq!(decode_base64("QUI="), Some(b"AB".to_vec()));
        assert_eq!(decode_base64("QUJD"), Some(b"ABC".to_vec()));
        for bad in ["", "QQ", "QR==", "QQ=A", "Q===", "QU I", "QUJD\n", "===="] {
            assert_eq!(decode_base64(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn end_counts_must_match() {
        let mut state = InbandState::default();
        // one end item saying 1 frame, none came: 02 10000000 00000000 01000000 00000000 00000000
        let raw = [
            2u8, 16, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        let data = encode(&raw);
        let err = state.event(&data, &mut |_| {}).unwrap_err();
        assert_eq!(
            err,
            "in-band telemetry: the end item counts 1 frames, 0 came"
        );
    }

    /// `raw` in standard base64 (the tests' encoder; the plugin's is Python's).
    pub(crate) fn encode(raw: &[u8]) -> String {
        let mut s = String::new();
        for chunk in raw.chunks(3) {
            let mut acc = 0u32;
            for (i, b) in chunk.iter().enumerate() {
                acc |= u32::from(*b) << (16 - 8 * i);
            }
            for i in 0..4 {
                if i <= chunk.len() {
                    s.push(ALPHABET[((acc >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    s.push('=');
                }
            }
        }
        s
    }
}

#[cfg(test)]
mod vectors {
    use super::*;
    use serde_json::{json, Value};

    fn meaning(item: &Item) -> Value {
        match item {
            Item::Frame(f) => json!({"kind": "frame", "hex": hex(f)}),
            Item::End(e) => json!({
                "kind": "end", "status": e.status, "frames": e.frames,
                "dropped": e.dropped, "waited_us": e.waited_us, "reason": lost_reason(e),
            }),
        }
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// tests/vectors/inband/inband.json, as the reference decoder passes it.
    #[test]
    fn decoder_passes_the_vectors() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/vectors/inband/inband.json");
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let cases = doc["cases"].as_array().unwrap();
        assert!(cases.len() > 20);
        for case in cases {
            let data = case["data"].as_str().unwrap();
            match decode_event(data) {
                Ok(items) => {
                    let got: Vec<Value> = items.iter().map(meaning).collect();
                    assert_eq!(Value::Array(got), case["items"], "{}", case["name"]);
                }
                Err(e) => assert_eq!(e, case["error"].as_str().unwrap(), "{}", case["name"]),
            }
        }
    }
}
