//! A first-in first-out queue of small `Copy` items, for a stream's queues
//! (provenance records, fragments, text record and chunk ends, pending give
//! counts) that `advance` and the joins read on every input: a vector and
//! the index of its front. The front is `buf[head]` (no wrap-around
//! arithmetic, unlike `VecDeque`), a queue that empties goes back to the
//! start of its buffer, and the items left are iterated as one slice. Most
//! queues empty at every step.

/// Items `buf[head..]`, oldest first.
#[derive(Debug)]
pub(super) struct Fifo<T> {
    buf: Vec<T>,
    head: usize,
}

impl<T> Default for Fifo<T> {
    fn default() -> Self {
        Fifo {
            buf: Vec::new(),
            head: 0,
        }
    }
}

impl<T: Copy> Fifo<T> {
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.buf.len() - self.head
    }

    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.head == self.buf.len()
    }

    #[inline]
    pub(super) fn front(&self) -> Option<&T> {
        self.buf.get(self.head)
    }

    /// The `i`-th item from the front.
    #[inline]
    pub(super) fn get(&self, i: usize) -> Option<&T> {
        self.buf[self.head..].get(i)
    }

    #[inline]
    pub(super) fn iter(&self) -> std::slice::Iter<'_, T> {
        self.buf[self.head..].iter()
    }

    #[inline(always)]
    pub(super) fn push_back(&mut self, item: T) {
        // Full with at least half of it popped: move the rest to the start
        // (at most as many moves as pops since the last move: amortised O(1)).
        // It only grows when more than half of it is held, so its capacity
        // stays within four times the most items ever held.
        if self.buf.len() == self.buf.capacity() && self.head > 0 && self.head * 2 >= self.buf.len()
        {
            self.buf.drain(..self.head);
            self.head = 0;
        }
        self.buf.push(item);
    }

    #[inline]
    pub(super) fn pop_front(&mut self) -> Option<T> {
        let item = *self.buf.get(self.head)?;
        self.head += 1;
        self.restart_if_empty();
        Some(item)
    }

    /// Drop the first `n` items (all of them if fewer).
    #[inline]
    pub(super) fn drop_front(&mut self, n: usize) {
        self.head += n.min(self.len());
        self.restart_if_empty();
    }

    /// An emptied queue goes back to the start of its buffer.
    #[inline]
    fn restart_if_empty(&mut self) {
        if self.head == self.buf.len() {
            self.clear();
        }
    }

    /// Drop every item, keeping the memory.
    #[inline]
    pub(super) fn clear(&mut self) {
        self.buf.clear();
        self.head = 0;
    }

    /// Drop every item and the memory.
    pub(super) fn release(&mut self) {
        *self = Fifo::default();
    }
}

impl<T> std::ops::Index<usize> for Fifo<T> {
    type Output = T;

    /// The `i`-th item from the front (panics beyond the last, as `VecDeque`).
    #[inline]
    fn index(&self, i: usize) -> &T {
        &self.buf[self.head..][i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Random pushes, pops, multi-pops, fronts, indexing and iteration give
    /// what a `VecDeque` gives, and the buffer's capacity stays within four
    /// times the most items held.
    #[test]
    fn fifo_is_a_vecdeque() {
        let mut rng = crate::workload::Rng(7);
        let mut fifo: Fifo<u32> = Fifo::default();
        let mut model: VecDeque<u32> = VecDeque::new();
        let mut most = 0usize;
        for i in 0..200_000u32 {
            // Phases that grow, hold steady and drain the queue.
            let bias = match (i / 5_000) % 3 {
                0 => 6,
                1 => 5,
                _ => 3,
            };
            match rng.range(0, 9) {
                r if r < bias => {
                    fifo.push_back(i);
                    model.push_back(i);
                }
                9 => {
                    let n = rng.range(0, 4) as usize;
                    fifo.drop_front(n);
                    for _ in 0..n {
                        model.pop_front();
                    }
                }
                _ => assert_eq!(fifo.pop_front(), model.pop_front()),
            }
            most = most.max(model.len());
            assert_eq!(fifo.len(), model.len());
            assert_eq!(fifo.is_empty(), model.is_empty());
            assert_eq!(fifo.front(), model.front());
            assert_eq!(fifo.get(1), model.get(1));
            if !model.is_empty() {
                assert_eq!(fifo[model.len() - 1], model[model.len() - 1]);
            }
            if i % 1_013 == 0 {
                fifo.clear();
                model.clear();
            }
            if i % 97 == 0 {
                assert!(fifo.iter().eq(model.iter()));
            }
            let cap = fifo.buf.capacity();
            assert!(cap <= 4 * most.max(1), "capacity {cap}, held {most}");
        }
        assert!(most > 100, "{most}");
        fifo.release();
        assert!(fifo.is_empty() && fifo.buf.capacity() == 0);
    }
}
