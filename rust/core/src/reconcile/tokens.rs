//! The retained tokens of one stream: a ring indexed by absolute token
//! offset (`offset & mask`), so a witness's token reaches its slot with one
//! mask and one load, without the head arithmetic and wrap test of a
//! `VecDeque` index, and releasing passed tokens is moving `base`.

use super::Tok;

/// Tokens at absolute offsets `base..end`, each at `buf[offset & mask]`
/// (`mask = buf.len() - 1`; `buf.len()` is 0 or a power of two). 32 bytes,
/// so that it shares a cache line with the stream's other hot fields.
#[derive(Debug, Default)]
pub(super) struct TokRing {
    buf: Box<[Tok]>,
    /// Offset of the oldest retained token.
    base: u64,
    /// One past the newest retained token.
    end: u64,
}

/// Slots of a stream's first allocation.
const FIRST_CAPACITY: usize = 16;

impl TokRing {
    /// Tokens held.
    #[inline]
    pub(super) fn len(&self) -> usize {
        (self.end - self.base) as usize
    }

    /// Offset of the oldest retained token.
    #[cfg(test)]
    pub(super) fn base(&self) -> u64 {
        self.base
    }

    /// The slot of offset `o`, at most one past the retained tokens (a new
    /// token starts as `Tok::default()`). Beyond that is a bug of the
    /// caller: it panics, as indexing past a `VecDeque` did.
    #[inline]
    pub(super) fn slot(&mut self, o: u64) -> &mut Tok {
        if o == self.end {
            if self.len() == self.buf.len() {
                self.grow();
            }
            self.end += 1;
            let mask = self.mask();
            let t = &mut self.buf[o as usize & mask];
            *t = Tok::default();
            return t;
        }
        assert!(o >= self.base && o < self.end, "token {o} not retained");
        let mask = self.mask();
        &mut self.buf[o as usize & mask]
    }

    /// The retained token at offset `o`.
    #[inline]
    pub(super) fn get(&self, o: u64) -> &Tok {
        debug_assert!(o >= self.base && o < self.end, "token {o} not retained");
        &self.buf[o as usize & self.mask()]
    }

    /// `offset & mask` is an offset's slot (wrapping to `usize::MAX` for
    /// the empty ring, which `slot` grows before using).
    #[inline]
    fn mask(&self) -> usize {
        self.buf.len().wrapping_sub(1)
    }

    /// Forget the tokens before offset `keep` (at most every retained one).
    #[inline]
    pub(super) fn release_before(&mut self, keep: u64) {
        if keep > self.base {
            self.base = keep.min(self.end);
        }
    }

    /// Drop every retained token and the memory (the offsets are kept).
    pub(super) fn clear(&mut self) {
        self.buf = Box::default();
        self.end = self.base;
    }

    /// Double the ring, each retained token moving to its slot under the new mask.
    #[cold]
    fn grow(&mut self) {
        let cap = (self.buf.len() * 2).max(FIRST_CAPACITY);
        let mut buf = vec![Tok::default(); cap].into_boxed_slice();
        let mask = self.mask();
        for o in self.base..self.end {
            buf[o as usize & (cap - 1)] = self.buf[o as usize & mask];
        }
        self.buf = buf;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Offsets keep their tokens across growth, wrap-around and release, as
    /// a plain vector from offset 0 does.
    #[test]
    fn ring_keeps_every_retained_token() {
        let mut ring = TokRing::default();
        let mut model: Vec<u32> = Vec::new();
        let mut base = 0u64;
        for o in 0..5000u64 {
            ring.slot(o).p = o as u32 * 3 + 1;
            model.push(o as u32 * 3 + 1);
            // An existing slot is updated in place, not reset.
            ring.slot(o).t = 7;
            assert_eq!(ring.get(o).p, o as u32 * 3 + 1);
            // Release in uneven steps, sometimes holding a few hundred tokens.
            if o % 97 == 0 {
                base = o.saturating_sub(o % 300);
                ring.release_before(base);
            }
            assert_eq!(ring.base(), base);
            assert_eq!(ring.len() as u64, o + 1 - base);
            for k in base..=o {
                assert_eq!(ring.get(k).p, model[k as usize], "offset {k} at {o}");
                assert_eq!(ring.get(k).t, 7);
            }
        }
        ring.release_before(u64::MAX);
        assert_eq!((ring.base(), ring.len()), (5000, 0));
        ring.clear();
        assert_eq!(ring.slot(5000).p, 0, "a new token starts empty");
    }

    #[test]
    #[should_panic(expected = "token 3 not retained")]
    fn a_slot_beyond_the_next_one_panics() {
        let mut ring = TokRing::default();
        ring.slot(0);
        ring.slot(3);
    }
}
