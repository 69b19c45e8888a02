//! The WHATWG event-stream grammar, incrementally: bytes may arrive split
//! anywhere (inside a line, a CRLF pair or a UTF-8 character). Lines end with
//! CRLF, LF or CR; `:` starts a comment; `data:` lines of one event are
//! joined with `\n`; a blank line dispatches the event. Malformed input
//! yields a precise [`SseError`] for that event and parsing goes on with the
//! next one; nothing panics. Memory is bounded by [`MAX_LINE_BYTES`] and
//! [`MAX_EVENT_BYTES`].

use super::error::{SseError, MAX_EVENT_BYTES, MAX_LINE_BYTES};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
