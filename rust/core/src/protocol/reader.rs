//! A bounds-checked little-endian cursor over a datagram.

use super::{DecodeError, Kind};

/// A bounds-checked little-endian cursor over the datagram. Running out of
/// bytes reports the datagram offset where the field that needed them starts.
pub(super) struct Reader<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
    pub(super) kind: Kind,
}

impl<'a> Reader<'a> {
    #[inline]
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() - self.pos < n {
            return Err(DecodeError::TruncatedBody {
                kind: self.kind,
                pos: self.pos,
            });
        }
        // SAFETY: `pos <= buf.len()` always holds (it starts at most at the
        // header's end and only grows by an `n` checked against what is
        // left), and `n <= buf.len() - pos` was just checked.
        let s = unsafe { self.buf.get_unchecked(self.pos..self.pos + n) };
        self.pos += n;
        Ok(s)
    }

    #[inline]
    pub(super) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    #[inline]
    pub(super) fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    #[inline]
    pub(super) fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(super) fn finish(&self) -> Result<(), DecodeError> {
        let left = self.buf.len() - self.pos;
        if left != 0 {
            return Err(DecodeError::TrailingBytes {
                kind: self.kind,
                n: left,
            });
        }
        Ok(())
    }
}

#[inline]
pub(super) fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

#[inline]
pub(super) fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// `bytes` as `str` when valid UTF-8. ASCII is checked first (a word at a
/// time, and ASCII is valid UTF-8): most fragments and deltas are a few
/// ASCII bytes, for which the general check's fixed cost is most of a text
/// record's decoding.
#[inline]
pub(super) fn utf8(bytes: &[u8]) -> Option<&str> {
    if bytes.is_ascii() {
        // SAFETY: every byte is below 0x80: valid UTF-8.
        return Some(unsafe { std::str::from_utf8_unchecked(bytes) });
    }
    std::str::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::utf8;

    /// The same answer as `std::str::from_utf8` for every byte string of up
    /// to 3 bytes over a set of ASCII, lead, continuation and invalid bytes,
    /// placed after 0 to 9 ASCII bytes (across the word boundary).
    #[test]
    fn utf8_agrees_with_std() {
        let alphabet = [0x00, 0x41, 0x7f, 0x80, 0xbf, 0xc2, 0xe2, 0xf0, 0xf4, 0xff];
        for pad in 0..10 {
            for a in alphabet {
                for b in alphabet {
                    for c in alphabet {
                        let mut v = vec![b'x'; pad];
                        v.extend([a, b, c]);
                        for end in pad..=v.len() {
                            let s = &v[..end];
                            assert_eq!(utf8(s), std::str::from_utf8(s).ok(), "{s:?}");
                        }
                    }
                }
            }
        }
    }
}
