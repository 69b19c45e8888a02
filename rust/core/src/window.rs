//! A byte stream of which only a suffix is kept: positions are absolute
//! (bytes since the start of the stream), the prefix already verified and
//! handed out is released.

/// The retained suffix of an append-only byte stream.
#[derive(Debug, Default)]
pub struct ByteWindow {
    /// Absolute position of `buf[0]`.
    base: u64,
    buf: Vec<u8>,
}

impl ByteWindow {
    /// Total bytes ever appended.
    #[inline]
    pub fn len(&self) -> u64 {
        self.base + self.buf.len() as u64
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    pub fn extend(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The bytes at absolute positions `start..end` (must be retained).
    #[inline]
    pub fn slice(&self, start: u64, end: u64) -> &[u8] {
        &self.buf[(start - self.base) as usize..(end - self.base) as usize]
    }

    /// Forget everything before absolute position `pos` (amortised: the
    /// buffer is compacted once the dead prefix is at least half of it).
    #[inline]
    pub fn release_before(&mut self, pos: u64) {
        let dead = pos.saturating_sub(self.base).min(self.buf.len() as u64) as usize;
        if dead >= 256 && dead * 2 >= self.buf.len() {
            self.buf.drain(..dead);
            self.base += dead as u64;
        }
    }

    /// Drop all retained bytes (the length is kept).
    pub fn clear(&mut self) {
        self.base = self.len();
        self.buf = Vec::new();
    }

    /// Bytes currently held in memory.
    pub fn retained(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_keeps_positions() {
        let mut w = ByteWindow::default();
        let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        w.extend(&data);
        w.release_before(600);
        assert_eq!(w.len(), 1000);
        assert!(w.retained() <= 400);
        assert_eq!(w.slice(600, 603), &data[600..603]);
        w.extend(b"xy");
        assert_eq!(w.slice(1000, 1002), b"xy");
        w.clear();
        assert_eq!(w.len(), 1002);
        assert_eq!(w.retained(), 0);
    }
}
