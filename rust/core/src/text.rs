//! `SpanText`: the text of a span event, stored inline when short (most spans
//! are one to a few characters), so emitting a span rarely allocates.

use std::fmt;
use std::ops::Deref;

const INLINE: usize = 30;

/// An immutable UTF-8 string, inline up to 30 bytes.
#[derive(Clone)]
pub struct SpanText(Repr);

#[derive(Clone)]
enum Repr {
    Inline { len: u8, buf: [u8; INLINE] },
    Heap(Box<str>),
}

impl SpanText {
    pub fn new(s: &str) -> Self {
        if s.len() <= INLINE {
            let mut buf = [0u8; INLINE];
            buf[..s.len()].copy_from_slice(s.as_bytes());
            SpanText(Repr::Inline {
                len: s.len() as u8,
                buf,
            })
        } else {
            SpanText(Repr::Heap(s.into()))
        }
    }

    /// Bytes of the text, without looking at them.
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Inline { len, .. } => *len as usize,
            Repr::Heap(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `self` followed by `tail` (inline when it fits: no allocation).
    pub fn concat(&self, tail: &str) -> Self {
        let head = self.as_str();
        let n = head.len() + tail.len();
        if n <= INLINE {
            let mut buf = [0u8; INLINE];
            buf[..head.len()].copy_from_slice(head.as_bytes());
            buf[head.len()..n].copy_from_slice(tail.as_bytes());
            SpanText(Repr::Inline { len: n as u8, buf })
        } else {
            let mut joined = String::with_capacity(n);
            joined.push_str(head);
            joined.push_str(tail);
            SpanText(Repr::Heap(joined.into_boxed_str()))
        }
    }

    /// Append `tail` in place (inline while it fits: no allocation, and
    /// no copy of the whole value, which a span being extended would cost).
    pub fn push_str(&mut self, tail: &str) {
        match &mut self.0 {
            Repr::Inline { len, buf } if usize::from(*len) + tail.len() <= INLINE => {
                let at = usize::from(*len);
                buf[at..at + tail.len()].copy_from_slice(tail.as_bytes());
                *len += tail.len() as u8;
            }
            _ => *self = self.concat(tail),
        }
    }

    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Inline { len, buf } => {
                let b = &buf[..*len as usize];
                debug_assert!(std::str::from_utf8(b).is_ok());
                // SAFETY: an inline buffer is only written by `new` and
                // `concat`, from whole `&str`s: its first `len` bytes are
                // valid UTF-8.
                unsafe { std::str::from_utf8_unchecked(b) }
            }
            Repr::Heap(s) => s,
        }
    }
}

impl Default for SpanText {
    fn default() -> Self {
        SpanText(Repr::Inline {
            len: 0,
            buf: [0; INLINE],
        })
    }
}

impl Deref for SpanText {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for SpanText {
    fn from(s: &str) -> Self {
        SpanText::new(s)
    }
}

impl PartialEq for SpanText {
    fn eq(&self, o: &Self) -> bool {
        self.as_str() == o.as_str()
    }
}

impl Eq for SpanText {}

impl fmt::Debug for SpanText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for SpanText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_and_heap() {
        for s in [
            "",
            "a",
            "\u{1f600}\u{6f22}",
            &"x".repeat(30),
            &"y".repeat(31),
        ] {
            let t = SpanText::new(s);
            assert_eq!(&*t, s);
            for tail in ["", "b", "\u{e9}", &"z".repeat(29)] {
                assert_eq!(&*t.concat(tail), format!("{s}{tail}"));
                let mut pushed = t.clone();
                pushed.push_str(tail);
                assert_eq!(&*pushed, format!("{s}{tail}"));
                pushed.push_str(tail);
                assert_eq!(&*pushed, format!("{s}{tail}{tail}"));
            }
            assert_eq!(t, SpanText::from(s));
            assert_eq!(format!("{t}"), s);
        }
    }
}
