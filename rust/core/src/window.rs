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

    /// Append `bytes`. Most appends are a record's or a delta's few bytes
    /// (about 5 on the benchmark workload): up to 16 are copied inline with
    /// two overlapping loads and stores, not by a call to `memcpy`.
    #[inline(always)]
    pub fn extend(&mut self, bytes: &[u8]) {
        let n = bytes.len();
        if n > 16 {
            return self.buf.extend_from_slice(bytes);
        }
        self.buf.reserve(n);
        let len = self.buf.len();
        // SAFETY: `reserve` made room for `n` bytes after `len`; every load
        // reads inside `bytes` (offsets `0..n`) and every store writes inside
        // `len..len + n`, which the stores fill completely (the two halves
        // overlap when `n` is not twice the word size), so `set_len` exposes
        // only written bytes.
        unsafe {
            let src = bytes.as_ptr();
            let dst = self.buf.as_mut_ptr().add(len);
            if n >= 8 {
                let a = src.cast::<u64>().read_unaligned();
                let b = src.add(n - 8).cast::<u64>().read_unaligned();
                dst.cast::<u64>().write_unaligned(a);
                dst.add(n - 8).cast::<u64>().write_unaligned(b);
            } else if n >= 4 {
                let a = src.cast::<u32>().read_unaligned();
                let b = src.add(n - 4).cast::<u32>().read_unaligned();
                dst.cast::<u32>().write_unaligned(a);
                dst.add(n - 4).cast::<u32>().write_unaligned(b);
            } else if n > 0 {
                *dst = *src;
                *dst.add(n / 2) = *src.add(n / 2);
                *dst.add(n - 1) = *src.add(n - 1);
            }
            self.buf.set_len(len + n);
        }
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
        // Most calls release nothing: less than 256 bytes to drop.
        if pos < self.base.saturating_add(256) {
            return;
        }
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

    /// Appends of every length from 0 to 40 bytes (the inline copy up to
    /// 16, `extend_from_slice` beyond), at every fill level of the buffer,
    /// give the bytes a plain vector holds.
    #[test]
    fn extend_appends_exactly_the_bytes() {
        let data: Vec<u8> = (0..64u32).map(|i| (i * 37 + 11) as u8).collect();
        let mut w = ByteWindow::default();
        let mut model = Vec::new();
        for round in 0..3 {
            for n in 0..=40usize {
                let from = (n * 7 + round) % 20;
                w.extend(&data[from..from + n]);
                model.extend_from_slice(&data[from..from + n]);
                assert_eq!(w.len(), model.len() as u64);
                assert_eq!(w.slice(0, w.len()), &model[..], "n {n}, round {round}");
            }
        }
    }

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

    /// `release_before` drops the dead prefix exactly when it is at least
    /// 256 bytes and half the buffer, for positions before, inside and
    /// beyond the retained bytes (the early return included).
    #[test]
    fn release_compacts_by_the_rule() {
        for base_bytes in [0usize, 300, 1000] {
            for len in [0usize, 100, 255, 256, 511, 512, 2000] {
                for pos in [0u64, 1, 255, 256, 257, 300, 555, 556, 1000, 1256, 5000] {
                    let mut w = ByteWindow::default();
                    w.extend(&vec![1u8; base_bytes]);
                    w.release_before(base_bytes as u64);
                    let base = w.len() - w.retained() as u64;
                    w.extend(&vec![2u8; len]);
                    let held = w.retained();
                    let dead = pos.saturating_sub(base).min(held as u64) as usize;
                    let compacts = dead >= 256 && dead * 2 >= held;
                    w.release_before(pos);
                    let want = if compacts { held - dead } else { held };
                    assert_eq!(w.retained(), want, "base {base} len {len} pos {pos}");
                    assert_eq!(w.len(), base + held as u64);
                }
            }
        }
    }
}
