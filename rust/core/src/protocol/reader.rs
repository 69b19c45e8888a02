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

    /// Bytes not yet read.
    #[inline]
    pub(super) fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// `take(n)`, or with `CHECKED` false the same without its check: the
    /// caller saw at least `n` bytes left (`left()`) for the whole run of
    /// fixed-size fields this read belongs to, so a record's fixed head is
    /// bounds-checked once, not field by field (a truncation can then not
    /// happen inside it, so the errors reported are the same).
    #[inline(always)]
    pub(super) fn take_f<const CHECKED: bool>(
        &mut self,
        n: usize,
    ) -> Result<&'a [u8], DecodeError> {
        if CHECKED {
            return self.take(n);
        }
        debug_assert!(self.left() >= n);
        // SAFETY: the caller checked `n <= buf.len() - pos` (see above), and
        // `pos <= buf.len()` always holds (as in `take`).
        let s = unsafe { self.buf.get_unchecked(self.pos..self.pos + n) };
        self.pos += n;
        Ok(s)
    }

    #[inline(always)]
    pub(super) fn u8_f<const CHECKED: bool>(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take_f::<CHECKED>(1)?[0])
    }

    #[inline(always)]
    pub(super) fn u16_f<const CHECKED: bool>(&mut self) -> Result<u16, DecodeError> {
        let b = self.take_f::<CHECKED>(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    #[inline(always)]
    pub(super) fn u32_f<const CHECKED: bool>(&mut self) -> Result<u32, DecodeError> {
        let b = self.take_f::<CHECKED>(4)?;
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
