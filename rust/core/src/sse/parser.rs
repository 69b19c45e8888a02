//! An OpenAI stream's events: the event-stream grammar (`events`), then
//! each event's chunk read by the fastest reader that answers — the byte
//! scanner for vLLM's compact chunk (`scan`), the typed serde path
//! (`typed`), the `serde_json::Value` path that decides everything else and
//! words every error (`value`). `data: [DONE]` ends the stream.

use super::chunk::{Chunk, SseEvent};
use super::error::SseError;
use super::events::{EventParser, RawEvent};
use super::scan::{scan_into, Scanned};
use super::value::parse_chunk_value;

/// Extract a chunk from an event's `data:` payload.
pub fn parse_chunk(data: &str) -> Result<Chunk, SseError> {
    if let Some(chunk) = super::scan::scan_chunk(data) {
        return Ok(chunk);
    }
    parse_chunk_unscanned(data)
}

/// [`parse_chunk`] for a chunk the scanner gave up on.
fn parse_chunk_unscanned(data: &str) -> Result<Chunk, SseError> {
    match super::typed::parse_chunk_typed(data) {
        Some(chunk) => Ok(chunk),
        None => parse_chunk_value(data),
    }
}

/// Event-stream parsing plus chunk extraction.
#[derive(Debug, Default)]
pub struct SseParser {
    events: EventParser,
    raw: Vec<Result<RawEvent, SseError>>,
    /// The scanner's reused buffers.
    scanned: Scanned,
}

/// One event as [`SseParser::feed_with`] hands it over.
pub enum Parsed<'a> {
    /// A chunk the scanner read, as places in its data (nothing allocated).
    Scanned { data: &'a str, chunk: &'a Scanned },
    /// Any other event or error.
    Event(Result<SseEvent, SseError>),
}

impl Parsed<'_> {
    pub fn into_owned(self) -> Result<SseEvent, SseError> {
        match self {
            Parsed::Scanned { data, chunk } => Ok(SseEvent::Chunk(chunk.to_chunk(data))),
            Parsed::Event(e) => e,
        }
    }
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed bytes; returns the events completed by them, in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Result<SseEvent, SseError>> {
        let mut out = Vec::new();
        self.feed_into(bytes, &mut out);
        out
    }

    /// The body ended.
    pub fn finish(&mut self) -> Vec<Result<SseEvent, SseError>> {
        let mut out = Vec::new();
        self.finish_into(&mut out);
        out
    }

    /// [`SseParser::feed`], appending to `out` (a reader's reused buffer).
    pub fn feed_into(&mut self, bytes: &[u8], out: &mut Vec<Result<SseEvent, SseError>>) {
        self.feed_with(bytes, &mut |p| out.push(p.into_owned()));
    }

    /// [`SseParser::finish`], appending to `out`.
    pub fn finish_into(&mut self, out: &mut Vec<Result<SseEvent, SseError>>) {
        self.finish_with(&mut |p| out.push(p.into_owned()));
    }

    /// Feed bytes; `on` gets the events completed by them, in order, a
    /// chunk of the scanner's grammar without being copied out of its data.
    pub fn feed_with(&mut self, bytes: &[u8], on: &mut impl FnMut(Parsed<'_>)) {
        self.events.feed(bytes, &mut self.raw);
        self.convert(on);
    }

    /// The body ended ([`SseParser::finish`] through `on`).
    pub fn finish_with(&mut self, on: &mut impl FnMut(Parsed<'_>)) {
        self.events.finish(&mut self.raw);
        self.convert(on);
    }

    fn convert(&mut self, on: &mut impl FnMut(Parsed<'_>)) {
        for r in self.raw.drain(..) {
            let ev = match r {
                Ok(ev) => ev,
                Err(e) => {
                    on(Parsed::Event(Err(e)));
                    continue;
                }
            };
            if !ev.event.is_empty() && ev.event != "message" {
                on(Parsed::Event(Ok(SseEvent::Other {
                    event: ev.event,
                    data: ev.data,
                })));
                continue;
            }
            if ev.data.trim() == "[DONE]" {
                on(Parsed::Event(Ok(SseEvent::Done)));
            } else if scan_into(&ev.data, &mut self.scanned) {
                on(Parsed::Scanned {
                    data: &ev.data,
                    chunk: &self.scanned,
                });
            } else {
                on(Parsed::Event(
                    parse_chunk_unscanned(&ev.data).map(SseEvent::Chunk),
                ));
            }
            self.events.recycle(ev.data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all(parts: &[&[u8]]) -> Vec<Result<SseEvent, SseError>> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for part in parts {
            out.extend(p.feed(part));
        }
        out.extend(p.finish());
        out
    }

    const CHAT: &str = "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"h\u{e9}\"},\"token_ids\":[5,6],\"finish_reason\":null}]}\n\n";

    #[test]
    fn chat_chunk_split_everywhere() {
        let whole = format!("{CHAT}: keep-alive\r\n\r\ndata: [DONE]\r\n\r\n");
        let b = whole.as_bytes();
        for cut in 0..b.len() {
            let ev = feed_all(&[&b[..cut], &b[cut..]]);
            assert_eq!(ev.len(), 2, "cut {cut}");
            match &ev[0] {
                Ok(SseEvent::Chunk(c)) => {
                    assert_eq!(c.id.as_deref(), Some("c1"));
                    assert_eq!(c.choices[0].text, "h\u{e9}");
                    assert_eq!(c.choices[0].token_ids, Some(vec![5, 6]));
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(ev[1], Ok(SseEvent::Done));
        }
        // Byte by byte.
        let parts: Vec<&[u8]> = b.chunks(1).collect();
        assert_eq!(feed_all(&parts).len(), 2);
    }

    #[test]
    fn cr_only_and_multiline_data() {
        let ev = feed_all(&[b"data: {\"choices\":\r", b"data: []}\r\r"]);
        assert_eq!(
            ev,
            vec![Ok(SseEvent::Chunk(Chunk {
                id: None,
                choices: vec![],
                usage: None,
                spec_steps: None,
                timings: None,
            }))]
        );
    }

    #[test]
    fn completions_usage_and_finish() {
        let ev = feed_all(&[b"data: {\"choices\":[{\"index\":1,\"text\":\"x\",\"token_ids\":[1],\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\n"]);
        let Ok(SseEvent::Chunk(c)) = &ev[0] else {
            panic!("{ev:?}")
        };
        assert_eq!(c.choices[0].index, 1);
        assert_eq!(c.choices[0].finish_reason.as_deref(), Some("stop"));
        assert_eq!(c.usage.as_ref().unwrap().total_tokens, Some(4));
    }

    #[test]
    fn errors_are_precise_and_recoverable() {
        let ev = feed_all(&[
            b"data: {nope\n\n",
            b"data: {\"choices\":[{\"index\":0,\"token_ids\":[1,-2]}]}\n\n",
            b"data: \xff\n\n",
            b"data: {\"error\":{\"message\":\"boom\"}}\n\n",
            b"data: [DONE]\n\n",
            b"data: {}",
        ]);
        let msgs: Vec<String> = ev
            .iter()
            .map(|e| match e {
                Ok(x) => format!("{x:?}"),
                Err(e) => e.to_string(),
            })
            .collect();
        assert_eq!(
            msgs,
            vec![
                "invalid JSON in SSE data: key must be a string at line 1 column 2",
                "invalid SSE chunk: choices[0].token_ids[1] must be an integer in 0..=4294967295",
                "invalid UTF-8 in SSE line 5",
                "server error in SSE stream: boom",
                "Done",
                "SSE stream ended inside an event (no blank line after its data)",
            ]
        );
    }

    #[test]
    fn other_events_and_bom() {
        let ev = feed_all(&[b"\xef\xbb\xbfevent: ping\ndata: 1\n\n"]);
        assert_eq!(
            ev,
            vec![Ok(SseEvent::Other {
                event: "ping".into(),
                data: "1".into()
            })]
        );
    }
}
