//! What a response's bytes are, as they arrive: the head (interim ones
//! skipped), then the error body of a status >= 400, a refusal (another
//! content type, a content coding) or the SSE body. Each
//! end is the exchange's outcome; no I/O here.

use super::message::{find_head_end, BodyDecoder, BodyError, Framing, Head, MAX_HEAD_BYTES};
use super::round::RoundInputs;
use super::sse_body::{StreamBody, StreamEnd};
use super::ERROR_BODY_LIMIT;
use crate::outcome::{EndKind, Outcome};
use crate::sse::inputs::SseInputRef;

/// The error body of a status >= 400 being read.
struct ErrorBody {
    status: u16,
    decoder: BodyDecoder,
    bytes: Vec<u8>,
}

/// One exchange's response so far.
pub(super) struct Response {
    /// The head's bytes until it is complete.
    head: Vec<u8>,
    error_body: Option<ErrorBody>,
    pub(super) body: Option<StreamBody>,
    /// SSE inputs read since the last publish.
    pub(super) deltas: RoundInputs,
}

impl Response {
    pub(super) fn new() -> Response {
        Response {
            head: Vec::new(),
            error_body: None,
            body: None,
            deltas: RoundInputs::default(),
        }
    }

    fn push_body(&mut self, data: Option<&[u8]>, time: f64) -> Option<Outcome> {
        let body = self.body.as_mut()?;
        let deltas = &mut self.deltas;
        let mut on_delta = |input: SseInputRef<'_>| deltas.push(input, time);
        match data {
            Some(d) => body.feed_ref(d, &mut on_delta),
            None => body.finish_ref(&mut on_delta),
        }
        let outcome = match &body.end {
            None => return None,
            Some(StreamEnd::Done | StreamEnd::BodyEnded) if body.finish_reason.is_some() => {
                Outcome::finished()
            }
            Some(StreamEnd::Done | StreamEnd::BodyEnded) => Outcome::failed(EndKind::NoFinish, ""),
            Some(StreamEnd::BadEvent(m)) => Outcome::failed(EndKind::BadSse, m.clone()),
            Some(StreamEnd::Framing(BodyError::Incomplete { .. })) => {
                Outcome::failed(EndKind::Closed, "")
            }
            Some(StreamEnd::Framing(e)) => Outcome::failed(EndKind::Framing, e.to_string()),
        };
        Some(outcome)
    }

    fn push_error_body(&mut self, data: Option<&[u8]>) -> Option<Outcome> {
        let eb = self.error_body.as_mut()?;
        let done = match data {
            Some(d) => {
                let mut out = Vec::new();
                let result = eb.decoder.feed(d, &mut out);
                let room = ERROR_BODY_LIMIT - eb.bytes.len();
                eb.bytes.extend_from_slice(&out[..out.len().min(room)]);
                result.is_err() || eb.decoder.is_complete() || eb.bytes.len() >= ERROR_BODY_LIMIT
            }
            None => true,
        };
        done.then(|| {
            Outcome::http(
                EndKind::HttpStatus,
                eb.status,
                String::from_utf8_lossy(&eb.bytes).into_owned(),
            )
        })
    }

    /// Response bytes before the head was complete.
    fn push_head(&mut self, data: &[u8], time: f64) -> Option<Outcome> {
        self.head.extend_from_slice(data);
        loop {
            let Some((end, sep)) = find_head_end(&self.head) else {
                return (self.head.len() > MAX_HEAD_BYTES).then(|| {
                    Outcome::failed(
                        EndKind::Protocol,
                        format!("response head longer than {MAX_HEAD_BYTES} bytes"),
                    )
                });
            };
            let head = match Head::parse(&self.head[..end]) {
                Ok(h) => h,
                Err(e) => return Some(Outcome::failed(EndKind::Protocol, e.0)),
            };
            let rest = self.head.split_off(end + sep);
            self.head.clear();
            if head.is_interim() {
                self.head = rest;
                continue; // 100 Continue, 103 Early Hints
            }
            let framing = match head.framing("POST") {
                Ok(f) => f,
                Err(e) => return Some(Outcome::failed(EndKind::Protocol, e.0)),
            };
            if head.status >= 400 {
                self.error_body = Some(ErrorBody {
                    status: head.status,
                    decoder: BodyDecoder::new(framing),
                    bytes: Vec::new(),
                });
                if framing == Framing::Length(0) {
                    return self.push_error_body(None);
                }
                if !rest.is_empty() {
                    return self.push_error_body(Some(&rest));
                }
                return None;
            }
            let content_type = head.get("content-type").unwrap_or_default();
            if !content_type
                .to_ascii_lowercase()
                .contains("text/event-stream")
            {
                return Some(Outcome::http(EndKind::NotSse, head.status, content_type));
            }
            let encoding = head.get("content-encoding").unwrap_or_default();
            let coding = encoding.trim().to_ascii_lowercase();
            if !coding.is_empty() && coding != "identity" {
                return Some(Outcome::failed(EndKind::Encoding, encoding));
            }
            self.body = Some(StreamBody::new(framing));
            if framing == Framing::Length(0) {
                return self.push_body(None, time);
            }
            if !rest.is_empty() {
                return self.push_body(Some(&rest), time);
            }
            return None;
        }
    }

    /// Bytes read at `time` (None: the connection closed); the exchange's
    /// end when they end it.
    pub(super) fn on_bytes(&mut self, data: Option<&[u8]>, time: f64) -> Option<Outcome> {
        if self.body.is_some() {
            self.push_body(data, time)
        } else if self.error_body.is_some() {
            self.push_error_body(data)
        } else {
            match data {
                Some(d) => self.push_head(d, time),
                None => Some(Outcome::failed(EndKind::NoResponse, "")),
            }
        }
    }
}
