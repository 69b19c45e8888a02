//! One stream's response body, from network reads to the reconciler's SSE
//! inputs: HTTP framing ([`super::BodyDecoder`]), then SSE events and chunk
//! JSON ([`crate::sse::SseParser`]), then what each chunk says
//! ([`crate::sse::inputs`]):
//! choice 0's text and token ids, the chunk id, other choices, the usage,
//! choice 0's finish reason, `[DONE]`.
//!
//! This is the fold the client's Python reader applied event by event; done
//! here, a network read holding many events costs one call.

use super::message::{BodyDecoder, BodyError, Framing};
use crate::sse::inputs::{ChunkInputs, SseInput, SseInputRef};
use crate::sse::{Parsed, SseEvent, SseParser, Usage};
use crate::telemetry::inband::{Given, InbandState, EVENT_NAME};

/// Why a stream's body ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamEnd {
    /// `data: [DONE]`.
    Done,
    /// The body ended (last chunk, length reached, or the close) without `[DONE]`.
    BodyEnded,
    /// An SSE or chunk error; the message of [`SseError`].
    BadEvent(String),
    /// The HTTP framing broke (or the connection closed inside the body).
    Framing(BodyError),
}

/// The reading state of one stream.
#[derive(Debug)]
pub struct StreamBody {
    body: BodyDecoder,
    sse: SseParser,
    decoded: Vec<u8>,
    inputs: ChunkInputs,
    /// The response's in-band telemetry (`event: parallelhue`).
    inband: InbandState,
    /// Choice 0's finish_reason, once a chunk gave it.
    pub finish_reason: Option<String>,
    /// The usage of the last chunk that had one.
    pub usage: Option<Usage>,
    /// Set once; after it, input is ignored.
    pub end: Option<StreamEnd>,
}

impl StreamBody {
    pub fn new(framing: Framing) -> Self {
        StreamBody {
            body: BodyDecoder::new(framing),
            sse: SseParser::new(),
            decoded: Vec::new(),
            inputs: ChunkInputs::new(),
            inband: InbandState::default(),
            finish_reason: None,
            usage: None,
            end: None,
        }
    }

    /// Bytes from the connection. `on_input` gets every SSE input the
    /// chunks hold, in order.
    pub fn feed(&mut self, input: &[u8], on_input: &mut impl FnMut(SseInput)) {
        self.feed_ref(input, &mut |i| on_input(i.to_owned()));
    }

    /// The connection closed.
    pub fn finish(&mut self, on_input: &mut impl FnMut(SseInput)) {
        self.finish_ref(&mut |i| on_input(i.to_owned()));
    }

    /// [`StreamBody::feed`] with the inputs borrowed from the chunks (valid
    /// for the call of `on_input` only).
    pub fn feed_ref(&mut self, input: &[u8], on_input: &mut impl FnMut(SseInputRef<'_>)) {
        if self.end.is_some() {
            return;
        }
        self.decoded.clear();
        let framing = self.body.feed(input, &mut self.decoded);
        let mut apply = Apply {
            inputs: &mut self.inputs,
            inband: &mut self.inband,
            finish_reason: &mut self.finish_reason,
            usage: &mut self.usage,
            end: &mut self.end,
            on_input,
        };
        self.sse.feed_with(&self.decoded, &mut |p| apply.event(p));
        if self.end.is_some() {
            return;
        }
        match framing {
            Err(e) => self.end = Some(StreamEnd::Framing(e)),
            Ok(()) if self.body.is_complete() => self.finish_events(on_input),
            Ok(()) => {}
        }
    }

    /// [`StreamBody::finish`] with the inputs borrowed.
    pub fn finish_ref(&mut self, on_input: &mut impl FnMut(SseInputRef<'_>)) {
        if self.end.is_some() {
            return;
        }
        match self.body.finish() {
            Err(e) => self.end = Some(StreamEnd::Framing(e)),
            Ok(()) => self.finish_events(on_input),
        }
    }

    /// A last event without its blank line still counts, as in the reference
    /// reader; an event cut off inside its data is an error.
    fn finish_events(&mut self, on_input: &mut impl FnMut(SseInputRef<'_>)) {
        let mut apply = Apply {
            inputs: &mut self.inputs,
            inband: &mut self.inband,
            finish_reason: &mut self.finish_reason,
            usage: &mut self.usage,
            end: &mut self.end,
            on_input,
        };
        self.sse.feed_with(b"\n\n", &mut |p| apply.event(p));
        self.sse.finish_with(&mut |p| apply.event(p));
        if apply.end.is_none() {
            apply.ended_normally();
            *apply.end = Some(StreamEnd::BodyEnded);
        }
    }
}

/// Applies the events of a read in order; after an end, the rest are dropped.
struct Apply<'s, F> {
    inputs: &'s mut ChunkInputs,
    inband: &'s mut InbandState,
    finish_reason: &'s mut Option<String>,
    usage: &'s mut Option<Usage>,
    end: &'s mut Option<StreamEnd>,
    on_input: &'s mut F,
}

impl<F: FnMut(SseInputRef<'_>)> Apply<'_, F> {
    /// `[DONE]` or the body's end: in-band telemetry begun and not ended is lost.
    fn ended_normally(&mut self) {
        if let Some(reason) = self.inband.body_ended() {
            (self.on_input)(SseInputRef::Lost(reason));
        }
    }

    fn event(&mut self, parsed: Parsed<'_>) {
        if self.end.is_some() {
            return;
        }
        let extracted = match parsed {
            Parsed::Scanned { data, chunk } => {
                self.inputs
                    .extract_scanned(data, chunk, &mut *self.on_input)
            }
            Parsed::Event(Ok(SseEvent::Chunk(chunk))) => {
                if chunk.usage.is_some() {
                    self.usage.clone_from(&chunk.usage);
                }
                self.inputs.extract_ref(&chunk, &mut *self.on_input)
            }
            Parsed::Event(Ok(SseEvent::Done)) => {
                self.ended_normally();
                *self.end = Some(StreamEnd::Done);
                return;
            }
            // In-band telemetry: the response's own frames (docs/PROTOCOL.md).
            Parsed::Event(Ok(SseEvent::Other { event, data })) if event == EVENT_NAME => {
                let on_input = &mut *self.on_input;
                let given = self.inband.event(&data, &mut |g| match g {
                    Given::Frame(frame) => on_input(SseInputRef::Frame(&frame)),
                    Given::Lost(reason) => on_input(SseInputRef::Lost(&reason)),
                });
                if let Err(e) = given {
                    *self.end = Some(StreamEnd::BadEvent(e));
                }
                return;
            }
            // An event with another `event:` type is not a completion chunk.
            Parsed::Event(Ok(SseEvent::Other { .. })) => return,
            Parsed::Event(Err(e)) => Err(e),
        };
        match extracted {
            Ok(()) => self.finish_reason.clone_from(&self.inputs.finish_reason),
            Err(e) => *self.end = Some(StreamEnd::BadEvent(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunked(events: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        for e in events {
            out.extend_from_slice(format!("{:x}\r\n{e}\r\n", e.len()).as_bytes());
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    }

    fn read_all(framing: Framing, parts: &[&[u8]], close: bool) -> (StreamBody, Vec<String>) {
        let mut body = StreamBody::new(framing);
        let mut seen = Vec::new();
        let mut on_input = |i: SseInput| {
            if let SseInput::Delta { text, token_ids } = i {
                seen.push(format!("{text}{token_ids:?}"));
            }
        };
        for p in parts {
            body.feed(p, &mut on_input);
        }
        if close {
            body.finish(&mut on_input);
        }
        (body, seen)
    }

    const A: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"h\u{e9}\"},\"token_ids\":[5,6],\"finish_reason\":null}]}\n\n";
    const B: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},\"token_ids\":[],\"finish_reason\":\"length\"}]}\n\n";
    const USAGE: &str = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    #[test]
    fn chunked_stream_split_everywhere() {
        let raw = chunked(&[A, B, USAGE, DONE]);
        for cut in 0..=raw.len() {
            let (body, seen) = read_all(Framing::Chunked, &[&raw[..cut], &raw[cut..]], false);
            assert_eq!(seen, vec!["h\u{e9}[5, 6]"], "cut {cut}");
            assert_eq!(body.finish_reason.as_deref(), Some("length"));
            assert_eq!(body.usage.as_ref().unwrap().total_tokens, Some(5));
            assert_eq!(body.end, Some(StreamEnd::Done));
        }
    }

    #[test]
    fn input_after_done_is_ignored() {
        let raw = format!("{A}{DONE}{A}");
        let (body, seen) = read_all(Framing::Close, &[raw.as_bytes()], true);
        assert_eq!(seen.len(), 1);
        assert_eq!(body.end, Some(StreamEnd::Done));
    }

    #[test]
    fn body_end_without_done_keeps_a_last_event_without_blank_line() {
        let raw = chunked(&[
            A,
            "data: {\"choices\":[{\"index\":0,\"text\":\"z\",\"finish_reason\":\"stop\"}]}",
        ]);
        let (body, seen) = read_all(Framing::Chunked, &[&raw], false);
        assert_eq!(seen, vec!["h\u{e9}[5, 6]", "z[]"]);
        assert_eq!(body.finish_reason.as_deref(), Some("stop"));
        assert_eq!(body.end, Some(StreamEnd::BodyEnded));
    }

    #[test]
    fn errors_end_the_stream() {
        let (body, seen) = read_all(
            Framing::Close,
            &[format!("{A}data: {{nope\n\n{A}").as_bytes()],
            true,
        );
        assert_eq!(seen.len(), 1);
        assert_eq!(
            body.end,
            Some(StreamEnd::BadEvent(
                "invalid JSON in SSE data: key must be a string at line 1 column 2".into()
            ))
        );
        let (body, _) = read_all(Framing::Chunked, &[b"5\r\nabc"], true);
        assert_eq!(
            body.end,
            Some(StreamEnd::Framing(BodyError::Incomplete {
                framing: "chunked"
            }))
        );
        let (body, _) = read_all(Framing::Chunked, &[b"q\r\n"], false);
        assert_eq!(
            body.end.map(|e| match e {
                StreamEnd::Framing(e) => e.to_string(),
                other => format!("{other:?}"),
            }),
            Some("invalid chunk size line \"q\" in a chunked body".into())
        );
    }

    #[test]
    fn close_delimited_body_ends_at_the_close() {
        let (body, seen) = read_all(Framing::Close, &[A.as_bytes(), B.as_bytes()], true);
        assert_eq!(seen.len(), 1);
        assert_eq!(body.end, Some(StreamEnd::BodyEnded));
        assert_eq!(body.finish_reason.as_deref(), Some("length"));
    }
}
