//! Incremental Server-Sent Events parsing (the WHATWG event-stream grammar)
//! and extraction of an OpenAI chat/completions streaming chunk.
//!
//! Bytes may arrive split anywhere (inside a line, a CRLF pair or a UTF-8
//! character). Lines end with CRLF, LF or CR; `:` starts a comment; `data:`
//! lines of one event are joined with `\n`; a blank line dispatches the event.
//! `data: [DONE]` ends an OpenAI stream. Malformed input yields a precise
//! [`SseError`] for that event and parsing goes on with the next one; nothing
//! panics. Memory is bounded by [`MAX_LINE_BYTES`] and [`MAX_EVENT_BYTES`].

use std::fmt;

use serde_json::Value;

use crate::sse_scan::{scan_into, Scanned};

/// Longest line kept; longer ones are reported and skipped.
pub const MAX_LINE_BYTES: usize = 8 << 20;
/// Most data bytes in one event.
pub const MAX_EVENT_BYTES: usize = 16 << 20;

/// An error in the event stream or in a chunk's JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SseError {
    /// A line longer than [`MAX_LINE_BYTES`] (1-based line number).
    LineTooLong { line: u64 },
    /// An event whose data exceeds [`MAX_EVENT_BYTES`].
    EventTooLarge { line: u64 },
    /// A line that is not valid UTF-8.
    InvalidUtf8 { line: u64 },
    /// The stream ended inside an event (data without the blank line).
    Unterminated,
    /// The data of an event is not JSON.
    Json { message: String },
    /// The JSON is not a chunk: `path` says where, `expected` what.
    Shape {
        path: String,
        expected: &'static str,
    },
    /// The server reported an error inside the stream.
    Server { message: String },
    /// Choice 0 has text or token ids after a chunk gave its finish_reason.
    ContentAfterFinish,
    /// Choice 0 gives another finish_reason than an earlier chunk's.
    FinishReasonChanged { before: String, now: String },
    /// `usage.prompt_tokens` differs from an earlier chunk's.
    PromptTokensChanged { before: u64, now: u64 },
}

impl fmt::Display for SseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SseError::LineTooLong { line } => {
                write!(f, "SSE line {line} longer than {MAX_LINE_BYTES} bytes")
            }
            SseError::EventTooLarge { line } => write!(
                f,
                "SSE event ending at line {line} has more than {MAX_EVENT_BYTES} data bytes"
            ),
            SseError::InvalidUtf8 { line } => write!(f, "invalid UTF-8 in SSE line {line}"),
            SseError::Unterminated => {
                f.write_str("SSE stream ended inside an event (no blank line after its data)")
            }
            SseError::Json { message } => write!(f, "invalid JSON in SSE data: {message}"),
            SseError::Shape { path, expected } => {
                write!(f, "invalid SSE chunk: {path} must be {expected}")
            }
            SseError::Server { message } => write!(f, "server error in SSE stream: {message}"),
            SseError::ContentAfterFinish => {
                f.write_str("invalid SSE chunk: choice 0 has content after its finish_reason")
            }
            SseError::FinishReasonChanged { before, now } => write!(
                f,
                "invalid SSE chunk: choice 0's finish_reason {} after {}",
                shown_reason(Some(now)),
                shown_reason(Some(before))
            ),
            SseError::PromptTokensChanged { before, now } => write!(
                f,
                "invalid SSE chunk: usage.prompt_tokens {now} after {before}"
            ),
        }
    }
}

impl std::error::Error for SseError {}

/// An SSE finish_reason as shown in a message: quoted (at most 40
/// characters), or null.
pub fn shown_reason(reason: Option<&str>) -> String {
    match reason {
        None => "null".to_owned(),
        Some(r) if r.chars().count() > 40 => {
            format!("'{}…'", r.chars().take(40).collect::<String>())
        }
        Some(r) => format!("'{r}'"),
    }
}

/// One dispatched event of the event stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawEvent {
    /// The `event:` field, empty for the default (`message`).
    pub event: String,
    /// The data lines joined with `\n`.
    pub data: String,
    /// The last `id:` seen, if any.
    pub id: Option<String>,
}

/// Incremental event-stream parser.
#[derive(Debug, Default)]
pub struct EventParser {
    line: Vec<u8>,
    /// The previous chunk ended with CR: a leading LF is that line's end.
    after_cr: bool,
    /// Discarding the rest of an over-long line.
    skipping: bool,
    started: bool,
    line_no: u64,
    data: String,
    has_data: bool,
    too_large: bool,
    event: String,
    id: Option<String>,
    /// Data buffers of dispatched events handed back by their reader
    /// ([`EventParser::recycle`]): the next events' data goes into them, so a
    /// steady stream of events allocates nothing for its data.
    spares: Vec<String>,
}

/// Spare data buffers kept at most (one engine step's events of one stream
/// arrive in one read, rarely more than this).
const MAX_SPARES: usize = 8;

impl EventParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed bytes; complete events (or errors) are appended to `out`.
    pub fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<Result<RawEvent, SseError>>) {
        if self.after_cr {
            self.after_cr = false;
            if let Some(b'\n') = bytes.first() {
                bytes = &bytes[1..];
            }
        }
        while !bytes.is_empty() {
            match memchr::memchr2(b'\n', b'\r', bytes) {
                Some(i) => {
                    if self.line.is_empty() && !self.skipping && i <= MAX_LINE_BYTES {
                        // The whole line is in this read: parse it in place.
                        self.line_no += 1;
                        self.parse_line(&bytes[..i], out);
                    } else {
                        self.push_line_bytes(&bytes[..i], out);
                        self.end_line(out);
                    }
                    if bytes[i] == b'\r' {
                        match bytes.get(i + 1) {
                            Some(b'\n') => bytes = &bytes[i + 2..],
                            Some(_) => bytes = &bytes[i + 1..],
                            None => {
                                self.after_cr = true;
                                bytes = &[];
                            }
                        }
                    } else {
                        bytes = &bytes[i + 1..];
                    }
                }
                None => {
                    self.push_line_bytes(bytes, out);
                    bytes = &[];
                }
            }
        }
    }

    /// The stream ended: an unterminated event is an error (and discarded).
    pub fn finish(&mut self, out: &mut Vec<Result<RawEvent, SseError>>) {
        if !self.line.is_empty() || self.skipping {
            self.end_line(out);
        }
        if self.has_data {
            out.push(Err(SseError::Unterminated));
        }
        self.reset_event();
    }

    fn push_line_bytes(&mut self, b: &[u8], out: &mut Vec<Result<RawEvent, SseError>>) {
        if self.skipping {
            return;
        }
        if self.line.len() + b.len() > MAX_LINE_BYTES {
            self.line.clear();
            self.skipping = true;
            out.push(Err(SseError::LineTooLong {
                line: self.line_no + 1,
            }));
            return;
        }
        self.line.extend_from_slice(b);
    }

    fn end_line(&mut self, out: &mut Vec<Result<RawEvent, SseError>>) {
        self.line_no += 1;
        if self.skipping {
            self.skipping = false;
            self.line.clear();
            return;
        }
        let mut line = std::mem::take(&mut self.line);
        self.parse_line(&line, out);
        // Reuse the line's allocation.
        line.clear();
        self.line = line;
    }

    /// One complete line (without its end), `line_no` already counted.
    fn parse_line(&mut self, line: &[u8], out: &mut Vec<Result<RawEvent, SseError>>) {
        let mut text = match std::str::from_utf8(line) {
            Ok(t) => t,
            Err(_) => {
                out.push(Err(SseError::InvalidUtf8 { line: self.line_no }));
                return;
            }
        };
        if !self.started {
            self.started = true;
            text = text.strip_prefix('\u{feff}').unwrap_or(text);
        }
        if text.is_empty() {
            self.dispatch(out);
        } else if !text.starts_with(':') {
            let (field, value) = match text.find(':') {
                Some(i) => {
                    let v = &text[i + 1..];
                    (&text[..i], v.strip_prefix(' ').unwrap_or(v))
                }
                None => (text, ""),
            };
            match field {
                "data" => {
                    if self.data.len() + value.len() + 1 > MAX_EVENT_BYTES {
                        self.too_large = true;
                    } else {
                        self.data.push_str(value);
                        self.data.push('\n');
                    }
                    self.has_data = true;
                }
                "event" => self.event = value.to_owned(),
                "id" if !value.contains('\0') => self.id = Some(value.to_owned()),
                _ => {}
            }
        }
    }

    fn dispatch(&mut self, out: &mut Vec<Result<RawEvent, SseError>>) {
        if self.too_large {
            out.push(Err(SseError::EventTooLarge { line: self.line_no }));
        } else if self.has_data {
            // The buffer itself goes out (without the last line's `\n`); a
            // spare one handed back by an earlier event's reader takes its place.
            let spare = self.spares.pop().unwrap_or_default();
            let mut data = std::mem::replace(&mut self.data, spare);
            data.pop();
            out.push(Ok(RawEvent {
                event: std::mem::take(&mut self.event),
                data,
                id: self.id.clone(),
            }));
        }
        self.reset_event();
    }

    /// Hand back the data of an event that has been read: its buffer holds
    /// the data of a later event.
    pub fn recycle(&mut self, mut data: String) {
        if self.spares.len() < MAX_SPARES && data.capacity() > 0 {
            data.clear();
            self.spares.push(data);
        }
    }

    fn reset_event(&mut self) {
        self.data.clear();
        self.has_data = false;
        self.too_large = false;
        self.event.clear();
    }
}

/// One choice of a streaming chunk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Choice {
    pub index: u32,
    /// `delta.content` (chat) or `text` (completions); empty when absent or null.
    pub text: String,
    /// `token_ids` of the choice (or of its delta); None when absent or null.
    pub token_ids: Option<Vec<u32>>,
    pub finish_reason: Option<String>,
}

/// Token usage, when the chunk carries it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub total_tokens: Option<u64>,
}

/// vLLM's per-request speculative-decoding metrics of the final usage chunk
/// (`metrics.speculative_decoding`, `--per-request-spec-decode-metrics
/// detailed`): accepted and drafted counts per verify step, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecSteps {
    pub per_step_accepted: Option<Vec<u32>>,
    pub per_step_drafted: Option<Vec<u32>>,
    /// The summary counts beside the lists, [`SPEC_SUMMARY_KEYS`] in order:
    /// read for the server-reported tier only (no reconciler rule reads them).
    pub summary: [Option<u64>; 3],
}

/// vLLM's summary counts of `metrics.speculative_decoding`, in [`SpecSteps::summary`]'s order.
pub const SPEC_SUMMARY_KEYS: [&str; 3] = [
    "num_spec_steps",
    "num_draft_tokens",
    "num_accepted_draft_tokens",
];

/// llama-server's cumulative counters of a chunk's `timings` (with
/// `timings_per_token`), in [`Chunk::timings`]' order.
pub const TIMINGS_KEYS: [&str; 3] = ["predicted_n", "draft_n", "draft_n_accepted"];

/// A chat/completions streaming chunk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chunk {
    pub id: Option<String>,
    pub choices: Vec<Choice>,
    pub usage: Option<Usage>,
    /// Present when the chunk has `metrics.speculative_decoding`.
    pub spec_steps: Option<SpecSteps>,
    /// llama-server's `timings` counters ([`TIMINGS_KEYS`]), when the chunk
    /// has a `timings` object: for the server-reported tier only (boxed: most
    /// chunks have none, and a chunk stays small).
    pub timings: Option<Box<[Option<u64>; 3]>>,
}

/// A parsed event of an OpenAI stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SseEvent {
    Chunk(Chunk),
    /// `data: [DONE]`.
    Done,
    /// An event with a non-default `event:` type, passed through.
    Other {
        event: String,
        data: String,
    },
}

fn shape(path: impl Into<String>, expected: &'static str) -> SseError {
    SseError::Shape {
        path: path.into(),
        expected,
    }
}

fn opt_str(v: Option<&Value>, path: impl FnOnce() -> String) -> Result<Option<String>, SseError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(shape(path(), "a string or null")),
    }
}

fn opt_u64(v: Option<&Value>, path: impl FnOnce() -> String) -> Result<Option<u64>, SseError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| shape(path(), "a non-negative integer")),
        Some(_) => Err(shape(path(), "a non-negative integer")),
    }
}

/// An optional array of u32 counts at `path`.
fn opt_u32_list(v: Option<&Value>, path: &str) -> Result<Option<Vec<u32>>, SseError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) => {
            let mut out = Vec::with_capacity(a.len());
            for (j, x) in a.iter().enumerate() {
                let n = x
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| shape(format!("{path}[{j}]"), "an integer in 0..=4294967295"))?;
                out.push(n);
            }
            Ok(Some(out))
        }
        Some(_) => Err(shape(path, "an array of integers or null")),
    }
}

/// `metrics.speculative_decoding`, if the chunk has it.
fn spec_steps(metrics: Option<&Value>) -> Result<Option<SpecSteps>, SseError> {
    let metrics = match metrics {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(shape("metrics", "an object or null")),
    };
    let spec = match metrics.get("speculative_decoding") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(shape("metrics.speculative_decoding", "an object or null")),
    };
    Ok(Some(SpecSteps {
        per_step_accepted: opt_u32_list(
            spec.get("per_step_accepted"),
            "metrics.speculative_decoding.per_step_accepted",
        )?,
        per_step_drafted: opt_u32_list(
            spec.get("per_step_drafted"),
            "metrics.speculative_decoding.per_step_drafted",
        )?,
        summary: counts(spec, &SPEC_SUMMARY_KEYS, "metrics.speculative_decoding")?,
    }))
}

/// The counts named `keys` of the object at `path`, each optional.
fn counts(
    object: &serde_json::Map<String, Value>,
    keys: &[&str; 3],
    path: &str,
) -> Result<[Option<u64>; 3], SseError> {
    let mut out = [None; 3];
    for (slot, key) in out.iter_mut().zip(keys) {
        *slot = opt_u64(object.get(*key), || format!("{path}.{key}"))?;
    }
    Ok(out)
}

/// llama-server's `timings` counters, if the chunk has a `timings` object.
fn timings(value: Option<&Value>) -> Result<Option<[Option<u64>; 3]>, SseError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(t)) => Ok(Some(counts(t, &TIMINGS_KEYS, "timings")?)),
        Some(_) => Err(shape("timings", "an object or null")),
    }
}

/// An error object's `message`, else the whole object as JSON.
fn server_error(error: &Value) -> SseError {
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .map_or_else(|| error.to_string(), str::to_owned);
    SseError::Server { message }
}

/// Extract a chunk from an event's `data:` payload.
pub fn parse_chunk(data: &str) -> Result<Chunk, SseError> {
    if let Some(chunk) = crate::sse_scan::scan_chunk(data) {
        return Ok(chunk);
    }
    parse_chunk_unscanned(data)
}

/// [`parse_chunk`] for a chunk the scanner gave up on.
fn parse_chunk_unscanned(data: &str) -> Result<Chunk, SseError> {
    match crate::sse_typed::parse_chunk_typed(data) {
        Some(chunk) => Ok(chunk),
        None => parse_chunk_value(data),
    }
}

/// [`parse_chunk`] through a `serde_json::Value`: the path that decides
/// every chunk the typed path gives up on, and every error message.
pub fn parse_chunk_value(data: &str) -> Result<Chunk, SseError> {
    let v: Value = serde_json::from_str(data).map_err(|e| SseError::Json {
        message: e.to_string(),
    })?;
    let obj = v
        .as_object()
        .ok_or_else(|| shape("the data", "a JSON object"))?;
    if let Some(err) = obj.get("error") {
        return Err(server_error(err));
    }
    if obj.get("object").and_then(Value::as_str) == Some("error") {
        return Err(server_error(&v));
    }
    let id = opt_str(obj.get("id"), || "id".to_owned())?;
    let choices = match obj.get("choices") {
        None => return Err(shape("choices", "present")),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(shape("choices", "an array")),
    };
    let mut out = Vec::with_capacity(choices.len());
    for (i, c) in choices.iter().enumerate() {
        out.push(parse_choice(i, c)?);
    }
    let usage = match obj.get("usage") {
        None | Some(Value::Null) => None,
        Some(Value::Object(u)) => Some(Usage {
            prompt_tokens: opt_u64(u.get("prompt_tokens"), || "usage.prompt_tokens".into())?,
            completion_tokens: opt_u64(u.get("completion_tokens"), || {
                "usage.completion_tokens".into()
            })?,
            total_tokens: opt_u64(u.get("total_tokens"), || "usage.total_tokens".into())?,
        }),
        Some(_) => return Err(shape("usage", "an object or null")),
    };
    let spec_steps = spec_steps(obj.get("metrics"))?;
    let timings = timings(obj.get("timings"))?.map(Box::new);
    Ok(Chunk {
        id,
        choices: out,
        usage,
        spec_steps,
        timings,
    })
}

fn parse_choice(i: usize, c: &Value) -> Result<Choice, SseError> {
    let c = c
        .as_object()
        .ok_or_else(|| shape(format!("choices[{i}]"), "an object"))?;
    let index = match c.get("index") {
        Some(Value::Number(n)) => {
            n.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| {
                    shape(
                        format!("choices[{i}].index"),
                        "an integer in 0..=4294967295",
                    )
                })?
        }
        None => return Err(shape(format!("choices[{i}].index"), "present")),
        Some(_) => {
            return Err(shape(
                format!("choices[{i}].index"),
                "an integer in 0..=4294967295",
            ))
        }
    };
    let delta = match c.get("delta") {
        None | Some(Value::Null) => None,
        Some(Value::Object(d)) => Some(d),
        Some(_) => return Err(shape(format!("choices[{i}].delta"), "an object")),
    };
    let text = match delta {
        Some(d) => opt_str(d.get("content"), || format!("choices[{i}].delta.content"))?,
        None => opt_str(c.get("text"), || format!("choices[{i}].text"))?,
    }
    .unwrap_or_default();
    let (ids_value, ids_path) = match c.get("token_ids") {
        Some(v) => (Some(v), "token_ids"),
        None => (delta.and_then(|d| d.get("token_ids")), "delta.token_ids"),
    };
    let token_ids = match ids_value {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => {
            let mut ids = Vec::with_capacity(a.len());
            for (j, t) in a.iter().enumerate() {
                let id = t
                    .as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(|| {
                        shape(
                            format!("choices[{i}].{ids_path}[{j}]"),
                            "an integer in 0..=4294967295",
                        )
                    })?;
                ids.push(id);
            }
            Some(ids)
        }
        Some(_) => {
            return Err(shape(
                format!("choices[{i}].{ids_path}"),
                "an array of integers or null",
            ))
        }
    };
    let finish_reason = opt_str(c.get("finish_reason"), || {
        format!("choices[{i}].finish_reason")
    })?;
    Ok(Choice {
        index,
        text,
        token_ids,
        finish_reason,
    })
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
    fn recycled_buffers_and_in_place_lines_keep_every_event_exact() {
        // Events of falling and rising sizes, whole lines and lines split
        // across reads, their buffers handed back as a reader does: no event
        // may show bytes of an earlier one, and line numbers stay counted.
        let datas: Vec<String> = (0..40)
            .map(|i| "x".repeat([90, 3, 40, 1, 200][i % 5]) + &i.to_string())
            .collect();
        let mut stream = String::new();
        for (i, d) in datas.iter().enumerate() {
            if i % 3 == 0 {
                stream.push_str(&format!(": comment {i}\r\n"));
            }
            stream.push_str(&format!("data: {d}\n"));
            if i % 4 == 0 {
                stream.push_str("data: second line\n");
            }
            stream.push('\n');
        }
        let bytes = stream.as_bytes();
        for step in [1, 7, 64, bytes.len()] {
            let mut p = EventParser::new();
            let mut got = Vec::new();
            for part in bytes.chunks(step) {
                let mut out = Vec::new();
                p.feed(part, &mut out);
                for ev in out {
                    let ev = ev.unwrap();
                    got.push(ev.data.clone());
                    p.recycle(ev.data);
                }
            }
            let want: Vec<String> = datas
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    if i % 4 == 0 {
                        format!("{d}\nsecond line")
                    } else {
                        d.clone()
                    }
                })
                .collect();
            assert_eq!(got, want, "reads of {step} bytes");
        }
        // A line that is not UTF-8 is named by its number, read whole or split.
        let bad = b"data: a\n\n: c\ndata: \xff\n\n";
        for step in [1, bad.len()] {
            let mut p = EventParser::new();
            let mut out = Vec::new();
            for part in bad.chunks(step) {
                p.feed(part, &mut out);
            }
            assert_eq!(out[1], Err(SseError::InvalidUtf8 { line: 4 }), "{step}");
        }
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
