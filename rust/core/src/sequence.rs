//! Per-source sequence tracking: frames are released in sequence order
//! starting at 0; duplicates are recognised; frames ahead of the next expected
//! one are buffered, at most [`REORDER_WINDOW`] of them. When one more would be
//! buffered the source has a gap at the missing sequence number, and release
//! resumes at the lowest buffered one. Memory per source is bounded by the
//! window.

use std::collections::BTreeMap;

/// Frames a source may have buffered ahead of a missing one.
pub const REORDER_WINDOW: usize = 64;

/// What became of an offered frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Offer {
    /// It is the next expected frame: process it now, then drain
    /// [`SeqTracker::pop_ready`].
    Release,
    /// Its sequence number was already released or is already buffered.
    Duplicate,
    /// Buffered ahead of a missing frame.
    Buffered,
    /// Buffering it exceeded the window: `missing` is lost for good. Release
    /// resumes at the lowest buffered frame: drain [`SeqTracker::pop_ready`].
    Gap { missing: u64 },
}

/// Sequence state of one source.
#[derive(Debug)]
pub struct SeqTracker<T> {
    /// The next sequence number expected: 2^64 once seq 2^64 − 1 was
    /// released (every later frame is then a duplicate, never saturating
    /// back to a number already released).
    next: u128,
    buffered: BTreeMap<u64, T>,
    window: usize,
}

impl<T> Default for SeqTracker<T> {
    fn default() -> Self {
        Self::new(REORDER_WINDOW)
    }
}

impl<T> SeqTracker<T> {
    pub fn new(window: usize) -> Self {
        SeqTracker {
            next: 0,
            buffered: BTreeMap::new(),
            window,
        }
    }

    /// The next sequence number expected (u64::MAX also after it was released).
    pub fn next_expected(&self) -> u64 {
        u64::try_from(self.next).unwrap_or(u64::MAX)
    }

    /// Frames waiting for a missing one.
    pub fn buffered_len(&self) -> usize {
        self.buffered.len()
    }

    /// Offer the frame with sequence number `seq`; `keep` makes the owned
    /// copy to buffer, and is called only when the frame must wait.
    pub fn offer(&mut self, seq: u64, keep: impl FnOnce() -> T) -> Offer {
        if u128::from(seq) < self.next || self.buffered.contains_key(&seq) {
            return Offer::Duplicate;
        }
        if u128::from(seq) == self.next {
            self.next += 1;
            return Offer::Release;
        }
        self.buffered.insert(seq, keep());
        if self.buffered.len() > self.window {
            let missing = self.next_expected();
            if let Some((&first, _)) = self.buffered.first_key_value() {
                self.next = u128::from(first);
            }
            return Offer::Gap { missing };
        }
        Offer::Buffered
    }

    /// The next buffered frame if it is the next expected one.
    pub fn pop_ready(&mut self) -> Option<T> {
        let entry = self.buffered.first_entry()?;
        if u128::from(*entry.key()) != self.next {
            return None;
        }
        self.next += 1;
        Some(entry.remove())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_sequence_number_is_released_once() {
        let mut t: SeqTracker<u64> = SeqTracker::new(0);
        assert!(matches!(t.offer(u64::MAX, || 1), Offer::Gap { missing: 0 }));
        assert_eq!(drain(&mut t), vec![1]);
        assert!(matches!(t.offer(u64::MAX, || 2), Offer::Duplicate));
        assert_eq!(t.next_expected(), u64::MAX);
    }

    fn drain(t: &mut SeqTracker<u64>) -> Vec<u64> {
        std::iter::from_fn(|| t.pop_ready()).collect()
    }

    #[test]
    fn in_order_and_duplicates() {
        let mut t = SeqTracker::default();
        assert_eq!(t.offer(0, || 0), Offer::Release);
        assert_eq!(t.offer(0, || 0), Offer::Duplicate);
        assert_eq!(t.offer(1, || 1), Offer::Release);
        assert_eq!(t.next_expected(), 2);
    }

    #[test]
    fn reorder_within_window() {
        let mut t = SeqTracker::default();
        assert_eq!(t.offer(2, || 2), Offer::Buffered);
        assert_eq!(t.offer(2, || 2), Offer::Duplicate);
        assert_eq!(t.offer(1, || 1), Offer::Buffered);
        assert_eq!(t.offer(0, || 0), Offer::Release);
        assert_eq!(drain(&mut t), vec![1, 2]);
        assert_eq!(t.buffered_len(), 0);
        assert_eq!(t.offer(1, || 1), Offer::Duplicate);
    }

    #[test]
    fn gap_after_window() {
        let mut t = SeqTracker::default();
        assert_eq!(t.offer(0, || 0), Offer::Release);
        for s in 2..=65 {
            assert_eq!(t.offer(s, || s), Offer::Buffered);
        }
        assert_eq!(t.buffered_len(), 64);
        assert_eq!(t.offer(66, || 66), Offer::Gap { missing: 1 });
        assert_eq!(drain(&mut t), (2..=66).collect::<Vec<_>>());
        // The late frame is now a duplicate (its slot was given up).
        assert_eq!(t.offer(1, || 1), Offer::Duplicate);
        assert_eq!(t.offer(67, || 67), Offer::Release);
    }

    #[test]
    fn gap_resumes_at_lowest_buffered() {
        let mut t = SeqTracker::new(2);
        assert_eq!(t.offer(5, || 5), Offer::Buffered);
        assert_eq!(t.offer(9, || 9), Offer::Buffered);
        assert_eq!(t.offer(6, || 6), Offer::Gap { missing: 0 });
        assert_eq!(drain(&mut t), vec![5, 6]);
        assert_eq!(t.next_expected(), 7);
        assert_eq!(t.buffered_len(), 1);
    }
}
