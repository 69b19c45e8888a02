//! The fastest path of [`super::parse_chunk`]: a byte scanner for the
//! compact chunk a vLLM server streams (`{"id":"..","object":"chat.completion.chunk",
//! "created":1,"model":"..","choices":[{"index":0,"delta":{"content":".."},..}]}`),
//! about a third of the instructions of the typed serde path per chunk.
//!
//! It answers only inside a small grammar and gives up (None) on anything
//! else, leaving the chunk to the typed path and then the `Value` path:
//! whitespace between tokens, a string with a backslash or a control
//! character, a number that is not a plain non-negative integer of at most
//! 18 digits (or of a u32 where one is read), a nested value under a key it
//! does not read, a repeated key it reads, `error`, `object: "error"`,
//! `usage`, `metrics` or `timings` other than null, a missing `choices` or `index`,
//! anything after the closing brace. Inside the grammar, every field is read
//! as the typed path reads it, so all three paths agree (tested against the
//! `Value` path on every chunk of the typed path's tests and on mutations).

use std::ops::Range;

use super::chunk::{Choice, Chunk, FoundChoice, FoundDelta};

/// A scanned chunk as places in its data (and in `ids`), so that the buffers
/// of one stream's chunks are reused: nothing is allocated per chunk.
#[derive(Clone, Debug, Default)]
pub struct Scanned {
    /// The chunk id's bytes in the data; None when absent or null.
    pub id: Option<Range<usize>>,
    pub choices: Vec<ScannedChoice>,
    /// Every token id list of the chunk, one after another.
    pub ids: Vec<u32>,
}

/// One choice of a [`Scanned`] chunk, read as [`Choice`] is.
#[derive(Clone, Debug, Default)]
pub struct ScannedChoice {
    pub index: u32,
    /// `delta.content` or `text` in the data; empty when absent or null.
    pub text: Range<usize>,
    /// The choice's token ids in [`Scanned::ids`]; None when absent or null.
    pub token_ids: Option<Range<usize>>,
    pub finish_reason: Option<Range<usize>>,
}

impl Scanned {
    /// The chunk, owned.
    pub fn to_chunk(&self, data: &str) -> Chunk {
        Chunk {
            id: self.id.clone().map(|r| data[r].to_owned()),
            choices: self
                .choices
                .iter()
                .map(|c| Choice {
                    index: c.index,
                    text: data[c.text.clone()].to_owned(),
                    token_ids: c.token_ids.clone().map(|r| self.ids[r].to_vec()),
                    finish_reason: c.finish_reason.clone().map(|r| data[r].to_owned()),
                })
                .collect(),
            usage: None,
            spec_steps: None,
            timings: None,
        }
    }
}

/// The chunk, or None when a slower path must decide.
pub(crate) fn scan_chunk(data: &str) -> Option<Chunk> {
    let mut scanned = Scanned::default();
    scan_into(data, &mut scanned).then(|| scanned.to_chunk(data))
}

/// Scan `data` into `out` (its buffers reused); false when a slower path
/// must decide (then `out` holds nothing of meaning).
pub fn scan_into(data: &str, out: &mut Scanned) -> bool {
    out.id = None;
    out.choices.clear();
    out.ids.clear();
    let mut s = Scan {
        b: data.as_bytes(),
        i: 0,
        out,
    };
    s.chunk().is_some() && s.i == s.b.len()
}

struct Scan<'a> {
    b: &'a [u8],
    i: usize,
    out: &'a mut Scanned,
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    fn eat_word(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i + word.len();
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }

    /// A string without escapes or control characters, as its place in the
    /// data (its quotes are ASCII, so the place falls on character boundaries).
    fn string(&mut self) -> Option<Range<usize>> {
        self.eat(b'"')?;
        let start = self.i;
        let len = self.b[start..]
            .iter()
            .position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
        self.i = start + len;
        self.eat(b'"')?;
        Some(start..start + len)
    }

    fn is_null(&mut self) -> bool {
        self.eat_word(b"null").is_some()
    }

    fn opt_string(&mut self) -> Option<Option<Range<usize>>> {
        if self.is_null() {
            return Some(None);
        }
        self.string().map(Some)
    }

    /// A plain non-negative integer of at most 18 digits, no leading zero.
    fn uint(&mut self) -> Option<u64> {
        let start = self.i;
        let digits = self.b[start..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if digits == 0 || digits > 18 || (digits > 1 && self.b[start] == b'0') {
            return None;
        }
        self.i += digits;
        if matches!(self.peek(), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        let mut n = 0u64;
        for &c in &self.b[start..self.i] {
            n = n * 10 + u64::from(c - b'0');
        }
        Some(n)
    }

    fn u32(&mut self) -> Option<u32> {
        u32::try_from(self.uint()?).ok()
    }

    /// A list of u32, appended to `ids`: its place there.
    fn opt_u32_list(&mut self) -> Option<Option<Range<usize>>> {
        if self.is_null() {
            return Some(None);
        }
        let start = self.out.ids.len();
        self.list(|s| {
            let n = s.u32()?;
            s.out.ids.push(n);
            Some(())
        })?;
        Some(Some(start..self.out.ids.len()))
    }

    /// A value under a key this path does not read: only a flat one.
    fn skip(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(|_| ()),
            b'n' => self.eat_word(b"null"),
            b't' => self.eat_word(b"true"),
            b'f' => self.eat_word(b"false"),
            _ => self.uint().map(|_| ()),
        }
    }

    /// `[` items `]`, each read by `item`.
    fn list(&mut self, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'[')?;
        if self.eat(b']').is_some() {
            return Some(());
        }
        loop {
            item(self)?;
            if self.eat(b']').is_some() {
                return Some(());
            }
            self.eat(b',')?;
        }
    }

    /// `{` members `}`: `member` reads the value of each key (the key
    /// without escapes, as this path reads every string).
    fn object(&mut self, mut member: impl FnMut(&mut Self, &[u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            let key = self.string()?;
            let b = self.b;
            self.eat(b':')?;
            member(self, &b[key])?;
            if self.eat(b'}').is_some() {
                return Some(());
            }
            self.eat(b',')?;
        }
    }

    fn chunk(&mut self) -> Option<()> {
        let mut id: Option<Option<Range<usize>>> = None;
        let mut object = false;
        let mut choices = false;
        let mut usage = false;
        let mut metrics = false;
        let mut timings = false;
        self.object(|s, key| match key {
            b"id" => once(&mut id, s.opt_string()?),
            b"object" => {
                let value = s.string()?;
                if object || &s.b[value] == b"error" {
                    return None;
                }
                object = true;
                Some(())
            }
            b"choices" => {
                if choices {
                    return None;
                }
                choices = true;
                s.list(|s| {
                    let c = s.choice()?;
                    s.out.choices.push(c);
                    Some(())
                })
            }
            // Only null: a usage, metrics or timings object is the typed path's.
            b"usage" => flag_null(s, &mut usage),
            b"metrics" => flag_null(s, &mut metrics),
            b"timings" => flag_null(s, &mut timings),
            b"error" => None,
            _ => s.skip(),
        })?;
        self.out.id = id.flatten();
        choices.then_some(())
    }

    fn choice(&mut self) -> Option<ScannedChoice> {
        let mut index: Option<u32> = None;
        let mut delta: Option<Option<Delta>> = None;
        let mut text: Option<Option<Range<usize>>> = None;
        let mut token_ids: Option<Option<Range<usize>>> = None;
        let mut finish_reason: Option<Option<Range<usize>>> = None;
        self.object(|s, key| match key {
            b"index" => once(&mut index, s.u32()?),
            b"delta" => {
                let d = if s.is_null() { None } else { Some(s.delta()?) };
                once(&mut delta, d)
            }
            b"text" => once(&mut text, s.opt_string()?),
            b"token_ids" => once(&mut token_ids, s.opt_u32_list()?),
            b"finish_reason" => once(&mut finish_reason, s.opt_string()?),
            _ => s.skip(),
        })?;
        let (text, token_ids) = FoundChoice {
            delta: delta.flatten(),
            text: text.flatten(),
            token_ids,
        }
        .resolve();
        Some(ScannedChoice {
            index: index?,
            text: text.unwrap_or(0..0),
            token_ids,
            finish_reason: finish_reason.flatten(),
        })
    }

    fn delta(&mut self) -> Option<Delta> {
        let mut content: Option<Option<Range<usize>>> = None;
        let mut token_ids: Option<Option<Range<usize>>> = None;
        self.object(|s, key| match key {
            b"content" => once(&mut content, s.opt_string()?),
            b"token_ids" => once(&mut token_ids, s.opt_u32_list()?),
            _ => s.skip(),
        })?;
        Some(Delta {
            content: content.flatten(),
            token_ids: token_ids.flatten(),
        })
    }
}

/// A chat delta's fields that count, as places.
type Delta = FoundDelta<Range<usize>, Range<usize>>;

/// Store a field's value; a second occurrence is a slower path's business.
fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value);
    Some(())
}

/// A key whose only value this path reads is null (once).
fn flag_null(s: &mut Scan<'_>, seen: &mut bool) -> Option<()> {
    if *seen || !s.is_null() {
        return None;
    }
    *seen = true;
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::parse_chunk_value;

    /// The chunks a vLLM server and the simulated engine send.
    const PLAIN: [&str; 8] = [
        r#"{"id":"chatcmpl-3f1c","object":"chat.completion.chunk","created":1764400000,"model":"sim","choices":[{"index":0,"delta":{"content":"世界 hello"},"logprobs":null,"finish_reason":null,"token_ids":[1234,5678]}]}"#,
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}"#,
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"x","token_ids":[7]},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}"#,
        r#"{"id":"cmpl-9","object":"text_completion","created":12,"model":"m","choices":[{"index":0,"text":" the","logprobs":null,"finish_reason":null,"stop_reason":null,"token_ids":[262]}]}"#,
        r#"{"id":"cmpl-9","object":"text_completion","created":12,"model":"m","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length","stop_reason":13}],"usage":null,"metrics":null}"#,
        r#"{"id":null,"choices":[]}"#,
        r#"{"choices":[{"index":1,"delta":null,"text":"a","token_ids":null},{"index":4294967295,"delta":{"content":null,"token_ids":[]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"b","token_ids":[1,2]},"token_ids":null,"x":true,"y":false}]}"#,
    ];

    #[test]
    fn the_plain_shapes_are_scanned_as_the_value_path_reads_them() {
        for data in PLAIN {
            let scanned = scan_chunk(data);
            assert!(scanned.is_some(), "not scanned: {data}");
            assert_eq!(scanned, parse_chunk_value(data).ok(), "{data}");
        }
        let c = scan_chunk(PLAIN[0]).unwrap();
        assert_eq!(c.id.as_deref(), Some("chatcmpl-3f1c"));
        assert_eq!(c.choices[0].text, "世界 hello");
        assert_eq!(c.choices[0].token_ids, Some(vec![1234, 5678]));
        // The choice's own null token_ids win over the delta's list.
        assert_eq!(scan_chunk(PLAIN[7]).unwrap().choices[0].token_ids, None);
        assert_eq!(
            scan_chunk(PLAIN[6]).unwrap().choices[1].index,
            u32::MAX,
            "the largest index"
        );
    }

    #[test]
    fn everything_outside_the_grammar_is_left_to_the_slower_paths() {
        for data in [
            r#"{"choices":[{"index":0,"delta":{"content":"a\nb"}}]}"#,
            r#"{"choices": [{"index":0}]}"#,
            r#"{"choices":[{"index":0}]} "#,
            r#"{"choices":[{"index":4294967296}]}"#,
            r#"{"choices":[{"index":01}]}"#,
            r#"{"choices":[{"index":1.0}]}"#,
            r#"{"choices":[{"index":0,"token_ids":[1e2]}]}"#,
            r#"{"choices":[{"index":0,"logprobs":{"content":[]}}]}"#,
            r#"{"choices":[{"index":0,"index":1}]}"#,
            r#"{"choices":[],"choices":[]}"#,
            r#"{"choices":[],"usage":{"completion_tokens":3}}"#,
            r#"{"choices":[],"metrics":{}}"#,
            r#"{"choices":[],"error":null}"#,
            r#"{"choices":[],"object":"error"}"#,
            r#"{"choices":[],"created":-1}"#,
            r#"{"choices":[],"created":1234567890123456789}"#,
            r#"{"choices":[{}]}"#,
            r#"{"id":"x"}"#,
            r#"{"choices":[{"index":0,"text":"t"}],}"#,
            r#"{"choi\u0063es":[]}"#,
            "[]",
            "",
        ] {
            assert_eq!(scan_chunk(data), None, "{data}");
        }
    }

    /// Every one-byte deletion, duplication and replacement (by a byte that
    /// matters to the grammar) of the plain chunks: where the scanner
    /// answers, the `Value` path accepts the same chunk.
    #[test]
    fn mutated_chunks_are_scanned_only_as_the_value_path_reads_them() {
        let mut answered = 0;
        let mut tried = 0;
        for data in PLAIN {
            let b = data.as_bytes();
            for i in 0..=b.len() {
                let mut cases: Vec<Vec<u8>> = Vec::new();
                if i < b.len() {
                    cases.push([&b[..i], &b[i + 1..]].concat());
                    cases.push([&b[..=i], &b[i..]].concat());
                }
                for r in b"\"\\:,{}[]0 9-.enulltf" {
                    cases.push([&b[..i], &[*r][..], b.get(i + 1..).unwrap_or(&[])].concat());
                    cases.push([&b[..i], &[*r][..], &b[i..]].concat());
                }
                for case in cases {
                    let Ok(s) = std::str::from_utf8(&case) else {
                        continue;
                    };
                    tried += 1;
                    if let Some(chunk) = scan_chunk(s) {
                        answered += 1;
                        assert_eq!(Ok(chunk), parse_chunk_value(s), "{s}");
                    }
                }
            }
        }
        // The mutations reach both sides of the grammar.
        assert!(
            answered > 1000 && answered < tried / 2,
            "{answered} of {tried}"
        );
    }

    /// Random one-to-three-byte edits (xorshift, fixed seed): the same
    /// property on edits the exhaustive test above does not combine.
    #[test]
    fn randomly_edited_chunks_are_scanned_only_as_the_value_path_reads_them() {
        let alphabet = b"\"\\:,{}[]019-.enulltfa ";
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        let mut answered = 0;
        for round in 0..16_000 {
            let mut b = PLAIN[round % PLAIN.len()].as_bytes().to_vec();
            for _ in 0..1 + next(3) {
                let i = next(b.len());
                let c = alphabet[next(alphabet.len())];
                match next(3) {
                    0 => b[i] = c,
                    1 => b.insert(i, c),
                    _ => {
                        b.remove(i);
                    }
                }
            }
            let Ok(s) = std::str::from_utf8(&b) else {
                continue;
            };
            if let Some(chunk) = scan_chunk(s) {
                answered += 1;
                assert_eq!(Ok(chunk), parse_chunk_value(s), "{s}");
            }
        }
        assert!(answered > 1000, "{answered}");
    }
}
