//! What each sending source announced (its hello) and its sequence state.

use std::collections::{BTreeMap, HashMap};

use crate::digest::Digest;
use crate::protocol::{Hello, HelloFields};
use crate::sequence::SeqTracker;

use super::ROLE_SCHEDULER;

/// What a hello announced, and which source sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceInfo {
    pub source_id: u64,
    pub hello: HelloFields,
}

impl SourceInfo {
    pub(super) fn from_hello(source_id: u64, h: &Hello<'_>) -> Self {
        SourceInfo {
            source_id,
            hello: HelloFields::from(h),
        }
    }

    pub fn role_name(&self) -> &'static str {
        role_name(self.hello.role)
    }

    pub fn engine_name(&self) -> &'static str {
        engine_name(self.hello.engine)
    }

    pub fn role_derivation_name(&self) -> &'static str {
        match self.hello.role_derivation {
            0 => "none",
            1 => "draft_ids",
            _ => "counts",
        }
    }

    pub fn verification_name(&self) -> &'static str {
        match self.hello.verification {
            0 => "none",
            1 => "standard",
            2 => "synthetic",
            3 => "fly",
            _ => "unknown",
        }
    }
}

pub(super) fn role_name(role: u8) -> &'static str {
    if role == ROLE_SCHEDULER {
        "scheduler"
    } else {
        "frontend"
    }
}

pub(super) fn engine_name(engine: u8) -> &'static str {
    if engine == 1 {
        "vllm"
    } else {
        "simulated"
    }
}

pub(super) struct Source {
    pub(super) seq: SeqTracker<Vec<u8>>,
    /// Keyed digest of every frame received, by sequence number: a
    /// duplicate must be byte-identical.
    pub(super) digests: Digests,
    /// Role from its hello, once released.
    pub(super) role: Option<u8>,
    /// Index of its hello in `infos`.
    pub(super) info: usize,
    /// Its first released frame was not a hello: the rest is ignored.
    pub(super) broken: bool,
}

pub(super) fn source_info(sources: &Sources, src: u64) -> usize {
    sources.get(src).map_or(0, |s| s.info)
}

/// Ids up to which a source is found by scanning the ids, not by the map.
const SCAN_SOURCES: usize = 8;

/// The sources by id, in order of their first admitted frame. A run has a
/// scheduler and a frontend, or a few of each: their ids are scanned (a
/// couple of compares; SipHash on every frame cost more than that, three
/// lookups a frame); beyond [`SCAN_SOURCES`] a map is kept as well.
#[derive(Default)]
pub(super) struct Sources {
    ids: Vec<u64>,
    list: Vec<Source>,
    /// Index in `ids` by id, once there are more than [`SCAN_SOURCES`].
    map: HashMap<u64, usize>,
}

impl Sources {
    #[inline]
    fn index(&self, id: u64) -> Option<usize> {
        if self.ids.len() <= SCAN_SOURCES {
            self.ids.iter().position(|&x| x == id)
        } else {
            self.map.get(&id).copied()
        }
    }

    #[inline]
    pub(super) fn get(&self, id: u64) -> Option<&Source> {
        self.index(id).map(|i| &self.list[i])
    }

    #[inline]
    pub(super) fn get_mut(&mut self, id: u64) -> Option<&mut Source> {
        self.index(id).map(|i| &mut self.list[i])
    }

    /// Add a source not yet present, last in the order.
    pub(super) fn push(&mut self, id: u64, source: Source) -> &mut Source {
        debug_assert!(self.index(id).is_none());
        self.ids.push(id);
        self.list.push(source);
        let n = self.ids.len();
        if n == SCAN_SOURCES + 1 {
            self.map = self.ids.iter().enumerate().map(|(i, &x)| (x, i)).collect();
        } else if n > SCAN_SOURCES {
            self.map.insert(id, n - 1);
        }
        &mut self.list[n - 1]
    }

    /// (id, source) in order of their first admitted frame.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &Source)> + '_ {
        self.ids.iter().copied().zip(&self.list)
    }
}

/// The keyed digest of each frame received, by sequence number (a map).
/// Sequence numbers come in order from 0 almost always: those from 0 up
/// without a hole are a vector indexed by sequence number, the rest a map
/// whose keys are all above the vector's length (a number that closes a
/// hole pulls the run after it into the vector, so one reordered datagram
/// does not leave the rest of the run on the map).
#[derive(Default)]
pub(super) struct Digests {
    dense: Vec<Digest>,
    sparse: BTreeMap<u64, Digest>,
}

impl Digests {
    /// The digest recorded for `seq`.
    #[inline]
    pub(super) fn get(&self, seq: u64) -> Option<Digest> {
        match usize::try_from(seq) {
            Ok(i) if i < self.dense.len() => Some(self.dense[i]),
            _ => self.sparse.get(&seq).copied(),
        }
    }

    /// Record (or replace) the digest for `seq`.
    #[inline]
    pub(super) fn insert(&mut self, seq: u64, digest: Digest) {
        let len = self.dense.len();
        match usize::try_from(seq) {
            Ok(i) if i < len => self.dense[i] = digest,
            Ok(i) if i == len => {
                self.dense.push(digest);
                while let Some(next) = self.sparse.remove(&(self.dense.len() as u64)) {
                    self.dense.push(next);
                }
            }
            _ => {
                self.sparse.insert(seq, digest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{BTreeMap, Digest, Digests, Source, Sources, SCAN_SOURCES};
    use crate::workload::Rng;

    /// `Digests` answers as the map it replaced for any order of sequence
    /// numbers: in order, with holes filled late, and far out of order.
    #[test]
    fn digests_equal_a_map() {
        let mut rng = Rng(20261202);
        let mut next = move || rng.next_u64();
        for case in 0..200u64 {
            let mut digests = Digests::default();
            let mut map: BTreeMap<u64, Digest> = BTreeMap::new();
            for op in 0..300u64 {
                let seq = match case % 3 {
                    0 => op,                // in order
                    1 => op ^ (next() & 7), // locally shuffled, holes filled late
                    _ => next() % 400,      // anywhere, repeats included
                };
                let digest: Digest = (op as u32, u128::from(next()));
                digests.insert(seq, digest);
                map.insert(seq, digest);
                let probe = next() % 410;
                assert_eq!(
                    digests.get(probe),
                    map.get(&probe).copied(),
                    "case {case} op {op}"
                );
                assert_eq!(digests.get(seq), Some(digest));
            }
            // The vector holds the whole run from 0 present so far (a closed
            // hole moved the run after it in), the map only keys beyond it.
            let run = (0u64..).take_while(|k| map.contains_key(k)).count();
            assert_eq!(digests.dense.len(), run, "case {case}");
            assert!(
                digests.sparse.keys().all(|&k| k > run as u64),
                "case {case}"
            );
            for seq in 0..410 {
                assert_eq!(
                    digests.get(seq),
                    map.get(&seq).copied(),
                    "case {case} seq {seq}"
                );
            }
        }
    }

    fn source(info: usize) -> Source {
        Source {
            seq: crate::sequence::SeqTracker::default(),
            digests: Digests::default(),
            role: None,
            info,
            broken: false,
        }
    }

    /// `Sources` finds each source by id as a map does, below, at and past
    /// the number where it starts keeping a map, and keeps their order.
    #[test]
    fn sources_find_every_id() {
        let mut rng = Rng(3);
        let mut sources = Sources::default();
        let mut ids: Vec<u64> = Vec::new();
        for n in 0..3 * SCAN_SOURCES {
            let id = loop {
                let id = rng.next_u64() % 64 + 1;
                if !ids.contains(&id) {
                    break id;
                }
            };
            assert!(sources.get(id).is_none());
            sources.push(id, source(n));
            ids.push(id);
            sources.get_mut(id).unwrap().broken = n % 2 == 0;
            for (i, &x) in ids.iter().enumerate() {
                let s = sources.get(x).unwrap();
                assert_eq!((s.info, s.broken), (i, i % 2 == 0), "n {n}");
            }
            for probe in 0..70u64 {
                assert_eq!(sources.get(probe).is_some(), ids.contains(&probe));
            }
            let order: Vec<(u64, usize)> = sources.iter().map(|(x, s)| (x, s.info)).collect();
            let want: Vec<(u64, usize)> = ids.iter().copied().zip(0..).collect();
            assert_eq!(order, want);
        }
    }
}
