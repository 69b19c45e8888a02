//! One stream's proven spans as the screen keeps them: the packed record
//! (two u64 words a span), [`SpanRecords`] (the store `Fed::take`'s spans
//! are appended to) and [`tail`] (the spans a pane shows, read back from the
//! end). The Python binding only converts (rust/py `spans.rs`, `panes.rs`);
//! `NO_STEP` and `NO_ROLE` reach Python from here (`parallelhue._native`).

use std::borrow::Cow;
use std::fmt;

/// Bytes of one packed span: two little-endian u64 words, its end offset in
/// the stream's SSE text, then `step | role << 32` (step [`NO_STEP`] for a
/// mixed span, role [`NO_ROLE`] when its characters do not share one). Span
/// `i` of a stream covers bytes `end[i-1]..end[i]`.
pub const SPAN_RECORD_BYTES: usize = 16;
/// The step of a mixed (or unproven) span in a packed record.
pub const NO_STEP: u32 = u32::MAX;
/// The role of a span whose characters do not share one role.
pub const NO_ROLE: u8 = u8::MAX;

/// The second word of a span record.
pub(crate) fn span_word(step: Option<u32>, role: Option<u8>) -> u64 {
    u64::from(step.unwrap_or(NO_STEP)) | (u64::from(role.unwrap_or(NO_ROLE)) << 32)
}

/// One packed span record ([`SPAN_RECORD_BYTES`]) appended to `out`.
#[inline]
pub(crate) fn push_span_record(out: &mut Vec<u8>, end: u64, word: u64) {
    out.extend_from_slice(&end.to_le_bytes());
    out.extend_from_slice(&word.to_le_bytes());
}

/// (end, step, role) of each packed span in `records`, for tests and tools.
pub fn unpack_spans(records: &[u8]) -> Vec<(u64, Option<u32>, Option<u8>)> {
    records
        .chunks_exact(SPAN_RECORD_BYTES)
        .map(|r| {
            let end = u64::from_le_bytes(r[..8].try_into().unwrap_or([0; 8]));
            let word = u64::from_le_bytes(r[8..].try_into().unwrap_or([0; 8]));
            let step = (word as u32 != NO_STEP).then_some(word as u32);
            let role = ((word >> 32) as u8 != NO_ROLE).then_some((word >> 32) as u8);
            (end, step, role)
        })
        .collect()
}

fn role_of(word: u64) -> u64 {
    (word >> 32) & u64::from(NO_ROLE)
}

/// Packed bytes that are not whole span records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartialRecord {
    pub bytes: usize,
}

impl fmt::Display for PartialRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "span records come in {SPAN_RECORD_BYTES}-byte spans; got {} bytes",
            self.bytes
        )
    }
}

impl std::error::Error for PartialRecord {}

/// One stream's span records, two words a span, and whether a span carried
/// a token role. Why not an `array('Q')` in Python: `Fed::take` appends
/// every stream's new spans at each redraw, and an array grows by 1/16 of
/// its size, so the 64 arrays of a run were reallocated and copied over and
/// over; a `Vec` doubles.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpanRecords {
    words: Vec<u64>,
    has_roles: bool,
}

impl SpanRecords {
    pub fn new() -> SpanRecords {
        SpanRecords::default()
    }

    pub fn words(&self) -> &[u64] {
        &self.words
    }

    /// Whether a span carried a token role (contract C2).
    pub fn has_roles(&self) -> bool {
        self.has_roles
    }

    /// Append packed records as `Fed::take` packs them (whole records).
    pub fn append_packed(&mut self, data: &[u8]) {
        debug_assert!(data.len().is_multiple_of(SPAN_RECORD_BYTES));
        let before = self.words.len();
        self.words.extend(
            data.chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes"))),
        );
        if !self.has_roles {
            self.has_roles = self.words[before..]
                .iter()
                .skip(1)
                .step_by(2)
                .any(|&w| role_of(w) != u64::from(NO_ROLE));
        }
    }

    /// [`SpanRecords::append_packed`] of bytes from outside: an error, and
    /// nothing appended, unless they are whole records.
    pub fn append_bytes(&mut self, data: &[u8]) -> Result<(), PartialRecord> {
        if !data.len().is_multiple_of(SPAN_RECORD_BYTES) {
            return Err(PartialRecord { bytes: data.len() });
        }
        self.append_packed(data);
        Ok(())
    }

    /// Append words one by one (ends and step/role words in turn).
    pub fn extend(&mut self, words: impl IntoIterator<Item = u64>) {
        for word in words {
            self.words.push(word);
            self.saw(self.words.len() - 1, word);
        }
    }

    /// The position of word `i` counted as Python counts (negative: from
    /// the end), if there is one.
    pub fn position(&self, i: isize) -> Option<usize> {
        let n = self.words.len() as isize;
        let at = if i < 0 { i + n } else { i };
        (0..n).contains(&at).then_some(at as usize)
    }

    /// Replace the word at `at` (a [`SpanRecords::position`]).
    pub fn set(&mut self, at: usize, word: u64) {
        self.words[at] = word;
        self.saw(at, word);
    }

    /// The words as little-endian bytes (16 a span).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.words.len() * 8);
        for w in &self.words {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out
    }

    /// Note a role when `word` (at `at`) is a span's step/role word.
    fn saw(&mut self, at: usize, word: u64) {
        if !at.is_multiple_of(2) && role_of(word) != u64::from(NO_ROLE) {
            self.has_roles = true;
        }
    }
}

/// How a pane's pieces are keyed (colored).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TailKeys {
    /// No keys: the pane is not colored.
    None,
    /// By the role byte: one key per byte value (256).
    ByRole,
    /// By step, `step % n` of `n` keys; a span of several steps: the other key.
    ByStep(usize),
}

impl TailKeys {
    /// The keying for `keys` keys (None: no keys) by role or by step.
    pub fn new(keys: Option<usize>, by_role: bool) -> Result<TailKeys, &'static str> {
        match keys {
            None => Ok(TailKeys::None),
            Some(n) if n == 0 || (by_role && n <= usize::from(NO_ROLE)) => {
                Err("tail_pieces: by role needs 256 keys, by step at least one")
            }
            Some(_) if by_role => Ok(TailKeys::ByRole),
            Some(n) => Ok(TailKeys::ByStep(n)),
        }
    }
}

/// A piece's key: none, the key at an index, or the key of a mixed span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PieceKey {
    None,
    Index(usize),
    Other,
}

/// The tail of a stream's spans: their texts, decoded, last span first, in
/// one string; each piece is where its text ends in it and its key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tail {
    pub text: String,
    pub pieces: Vec<(usize, PieceKey)>,
}

impl Tail {
    /// The pieces in text order: (text, key).
    pub fn in_order(&self) -> impl Iterator<Item = (&str, PieceKey)> {
        self.pieces.iter().enumerate().rev().map(|(i, &(to, key))| {
            let start = if i > 0 { self.pieces[i - 1].0 } else { 0 };
            (&self.text[start..to], key)
        })
    }
}

/// A span whose bytes are not all in the stream's text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanOutsideText;

impl fmt::Display for SpanOutsideText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("span outside the text")
    }
}

impl std::error::Error for SpanOutsideText {}

/// Characters as Python's `len` counts them after `decode("utf-8", "replace")`.
fn decoded(bytes: &[u8]) -> (Cow<'_, str>, usize) {
    match std::str::from_utf8(bytes) {
        // Code points are the bytes that do not continue a character.
        Ok(text) => (
            Cow::Borrowed(text),
            bytes.iter().filter(|&&b| b & 0xC0 != 0x80).count(),
        ),
        // Both replace each maximal invalid subpart by one U+FFFD (Unicode §3.9).
        Err(_) => {
            let text = String::from_utf8_lossy(bytes);
            let chars = text.chars().count();
            (text, chars)
        }
    }
}

/// The last spans of `words` (two words a span over `data`, the stream's SSE
/// text) holding at least `limit - total` characters (all of them for
/// `limit < 0`), each decoded as Python's `decode("utf-8", "replace")` does
/// and keyed by `keys`: what a pane of the live screen shows.
pub fn tail(
    data: &[u8],
    words: &[u64],
    limit: i64,
    total: i64,
    keys: TailKeys,
) -> Result<Tail, SpanOutsideText> {
    let mut out = Tail::default();
    let mut total = total;
    let mut position = words.len() / 2;
    let mut end = if position > 0 {
        words[2 * position - 2]
    } else {
        0
    };
    while position > 0 && (limit < 0 || total < limit) {
        position -= 1;
        let start = if position > 0 {
            words[2 * position - 2]
        } else {
            0
        };
        let word = words[2 * position + 1];
        let span = data
            .get(start as usize..end as usize)
            .ok_or(SpanOutsideText)?;
        let (piece, chars) = decoded(span);
        out.text.push_str(&piece);
        total += chars as i64;
        let key = match keys {
            TailKeys::None => PieceKey::None,
            TailKeys::ByRole => PieceKey::Index(role_of(word) as usize),
            TailKeys::ByStep(_) if word & u64::from(NO_STEP) == u64::from(NO_STEP) => {
                PieceKey::Other
            }
            TailKeys::ByStep(n) => {
                PieceKey::Index(((word & u64::from(NO_STEP)) % n as u64) as usize)
            }
        };
        out.pieces.push((out.text.len(), key));
        end = start;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packed(spans: &[(u64, u64)]) -> Vec<u8> {
        let mut out = Vec::new();
        for &(end, word) in spans {
            push_span_record(&mut out, end, word);
        }
        out
    }

    #[test]
    fn records_note_a_role_however_they_are_appended() {
        let mut records = SpanRecords::new();
        records.append_packed(&packed(&[(2, span_word(Some(0), None))]));
        assert!(!records.has_roles());
        // An end offset that looks like a role is not one.
        records.extend([3 << 32, span_word(Some(1), None)]);
        assert!(!records.has_roles());
        assert_eq!(records.words(), [2, 0xFF << 32, 3 << 32, 1 | 0xFF << 32]);
        let at = records.position(-1).unwrap();
        records.set(at, span_word(Some(1), Some(2)));
        assert!(records.has_roles());
        let mut other = SpanRecords::new();
        other
            .append_bytes(&packed(&[(5, span_word(None, Some(0)))]))
            .unwrap();
        assert!(other.has_roles());
        assert_eq!(unpack_spans(&other.to_le_bytes()), [(5, None, Some(0))]);
    }

    #[test]
    fn bytes_that_are_not_whole_records_are_refused_and_not_appended() {
        let mut records = SpanRecords::new();
        let e = records.append_bytes(&[0; 24]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "span records come in 16-byte spans; got 24 bytes"
        );
        assert!(records.words().is_empty());
    }

    #[test]
    fn positions_count_as_python_does() {
        let mut records = SpanRecords::new();
        records.extend([10, 11, 12, 13]);
        assert_eq!(
            [-5, -4, -1, 0, 3, 4].map(|i| records.position(i)),
            [None, Some(0), Some(3), Some(0), Some(3), None]
        );
    }

    #[test]
    fn a_tail_holds_the_last_spans_up_to_the_limit_decoded_and_keyed() {
        // "ab" step 0, "é" split over two spans (steps 1 and 2), "cd" mixed.
        let data = "abécd".as_bytes();
        let words = [
            2,
            span_word(Some(0), Some(1)),
            3,
            span_word(Some(1), Some(2)),
            4,
            span_word(Some(2), None),
            6,
            span_word(None, None),
        ];
        let by_step = tail(data, &words, -1, 0, TailKeys::ByStep(2)).unwrap();
        let pieces: Vec<_> = by_step.in_order().collect();
        assert_eq!(
            pieces,
            [
                ("ab", PieceKey::Index(0)),
                ("\u{FFFD}", PieceKey::Index(1)),
                ("\u{FFFD}", PieceKey::Index(0)),
                ("cd", PieceKey::Other),
            ]
        );
        // Spans until 4 more characters: the last three.
        let by_role = tail(data, &words, 6, 2, TailKeys::ByRole).unwrap();
        let pieces: Vec<_> = by_role.in_order().collect();
        assert_eq!(
            pieces,
            [
                ("\u{FFFD}", PieceKey::Index(2)),
                ("\u{FFFD}", PieceKey::Index(0xFF)),
                ("cd", PieceKey::Index(0xFF)),
            ]
        );
        let none = tail(data, &words, 1, 0, TailKeys::None).unwrap();
        assert_eq!(
            none.in_order().collect::<Vec<_>>(),
            [("cd", PieceKey::None)]
        );
        assert!(tail(data, &words, 0, 0, TailKeys::None)
            .unwrap()
            .pieces
            .is_empty());
    }

    #[test]
    fn a_span_beyond_the_text_is_an_error() {
        let words = [2, 0, 9, 0];
        assert_eq!(
            tail(b"abc", &words, -1, 0, TailKeys::None),
            Err(SpanOutsideText)
        );
        assert_eq!(SpanOutsideText.to_string(), "span outside the text");
    }

    #[test]
    fn keys_by_role_need_one_per_role_byte() {
        let error = "tail_pieces: by role needs 256 keys, by step at least one";
        assert_eq!(TailKeys::new(Some(255), true), Err(error));
        assert_eq!(TailKeys::new(Some(0), false), Err(error));
        assert_eq!(TailKeys::new(Some(256), true), Ok(TailKeys::ByRole));
        assert_eq!(TailKeys::new(Some(4), false), Ok(TailKeys::ByStep(4)));
        assert_eq!(TailKeys::new(None, true), Ok(TailKeys::None));
    }
}
