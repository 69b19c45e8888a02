//! A keyed digest of whole frames: a duplicate of a sequence number must be
//! byte-identical to the first frame with it, without keeping every frame's
//! bytes.
//!
//! NH (the hash of UMAC) over 64-bit words: the frame, zero-padded to a
//! multiple of 16 bytes, is read as pairs of words `(a, b)` and summed as
//! `Σ (a_i + k_2i) · (b_i + k_2i+1)` in 128-bit arithmetic, with a secret
//! random key `k` as long as the largest frame. For two different frames of
//! the same length, the sums agree for at most a 2^-64 fraction of the keys
//! (NH is 2^-64-almost-universal), whatever a sender chooses, as long as it
//! does not know the key — and digests are never shown. Frames of different
//! lengths differ by their length, kept beside the sum. About half an
//! instruction per byte (SipHash took 6).

use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;

use crate::protocol::MAX_FRAME_BYTES;

/// Key words: two per 16 bytes of the largest frame, and one pair to spare.
const KEY_WORDS: usize = MAX_FRAME_BYTES / 8 + 2;

/// A frame's digest: its length and its NH sum.
pub type Digest = (u32, u128);

/// splitmix64: expands the secret seed into the key.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The process's key, drawn once from the OS-seeded keys of `RandomState`.
fn process_key() -> &'static [u64] {
    static KEY: OnceLock<Box<[u64]>> = OnceLock::new();
    KEY.get_or_init(|| {
        let mut seed = RandomState::new().hash_one(0x5048_5545_u64);
        key_from_seed(&mut seed)
    })
}

fn key_from_seed(seed: &mut u64) -> Box<[u64]> {
    (0..KEY_WORDS).map(|_| splitmix(seed)).collect()
}

/// The digest function of a reconciler (one random key per process).
#[derive(Clone, Debug)]
pub struct FrameDigest {
    key: &'static [u64],
}

impl Default for FrameDigest {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameDigest {
    pub fn new() -> Self {
        FrameDigest { key: process_key() }
    }

    /// A digest with a key expanded from `seed` (tests).
    pub fn with_seed(mut seed: u64) -> Self {
        FrameDigest {
            key: Box::leak(key_from_seed(&mut seed)),
        }
    }

    /// The digest of a frame of at most `MAX_FRAME_BYTES` bytes (a longer
    /// input is digested by its first `MAX_FRAME_BYTES` bytes and its length).
    /// Two blocks per iteration (the sum's terms in another order: the same
    /// wrapping sum), and the last partial block read from the frame's last
    /// 16 bytes, shifted, not copied into a zeroed buffer (a memset and a
    /// memcpy call per frame); `reference` in the tests is the plain loop.
    pub fn digest(&self, data: &[u8]) -> Digest {
        let n = data.len();
        let data = &data[..n.min(MAX_FRAME_BYTES)];
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        let nh = |c: &[u8], k: &[u64]| {
            let a = word(&c[..8]).wrapping_add(k[0]);
            let b = word(&c[8..16]).wrapping_add(k[1]);
            u128::from(a) * u128::from(b)
        };
        let mut sum: u128 = 0;
        let mut pairs = data.chunks_exact(32);
        for (c, k) in (&mut pairs).zip(self.key.chunks_exact(4)) {
            sum = sum
                .wrapping_add(nh(&c[..16], &k[..2]))
                .wrapping_add(nh(&c[16..], &k[2..]));
        }
        let mut at = data.len() - pairs.remainder().len();
        if data.len() - at >= 16 {
            sum = sum.wrapping_add(nh(&data[at..at + 16], &self.key[at / 8..]));
            at += 16;
        }
        let rest = data.len() - at;
        if rest > 0 {
            // The last `rest` bytes, zero-padded to a block.
            let last = if data.len() >= 16 {
                let tail = &data[data.len() - 16..];
                u128::from_le_bytes(tail.try_into().unwrap_or([0; 16])) >> (8 * (16 - rest))
            } else {
                let mut last = [0u8; 16];
                last[..rest].copy_from_slice(&data[at..]);
                u128::from_le_bytes(last)
            };
            let i = at / 8;
            let a = (last as u64).wrapping_add(self.key[i]);
            let b = ((last >> 64) as u64).wrapping_add(self.key[i + 1]);
            sum = sum.wrapping_add(u128::from(a) * u128::from(b));
        }
        (n as u32, sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_bytes_equal_digests_and_any_change_shows() {
        let d = FrameDigest::with_seed(0x1234_5678_9abc_def1);
        let frame: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        assert_eq!(d.digest(&frame), d.digest(&frame.clone()));
        for i in [0, 7, 8, 15, 16, 500, 999] {
            let mut other = frame.clone();
            other[i] ^= 0x01;
            assert_ne!(d.digest(&frame), d.digest(&other), "byte {i}");
        }
        // Trailing zero bytes change the length.
        let mut longer = frame.clone();
        longer.push(0);
        assert_ne!(d.digest(&frame), d.digest(&longer));
        assert_ne!(d.digest(b""), d.digest(b"\0"));
        let full = vec![0xabu8; MAX_FRAME_BYTES];
        assert_eq!(d.digest(&full), d.digest(&full.clone()));
    }

    #[test]
    fn the_key_is_secret_and_matters() {
        let frame = b"PHUE frame bytes, a few more of them";
        let a = FrameDigest::with_seed(5);
        let b = FrameDigest::with_seed(6);
        assert_ne!(a.digest(frame), b.digest(frame));
        // One key per process: every reconciler compares with the same one.
        assert_eq!(
            FrameDigest::new().key.as_ptr(),
            FrameDigest::new().key.as_ptr()
        );
    }

    /// The digest as first written: one block at a time, the last one
    /// copied into a zeroed buffer.
    fn reference(d: &FrameDigest, data: &[u8]) -> Digest {
        let n = data.len();
        let data = &data[..n.min(MAX_FRAME_BYTES)];
        let word = |b: &[u8]| {
            let mut w = [0u8; 8];
            w.copy_from_slice(b);
            u64::from_le_bytes(w)
        };
        let mut sum: u128 = 0;
        let mut chunks = data.chunks_exact(16);
        for (pair, c) in d.key.chunks_exact(2).zip(&mut chunks) {
            let a = word(&c[..8]).wrapping_add(pair[0]);
            let b = word(&c[8..]).wrapping_add(pair[1]);
            sum = sum.wrapping_add(u128::from(a) * u128::from(b));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 16];
            last[..rest.len()].copy_from_slice(rest);
            let i = 2 * (data.len() / 16);
            let a = word(&last[..8]).wrapping_add(d.key[i]);
            let b = word(&last[8..]).wrapping_add(d.key[i + 1]);
            sum = sum.wrapping_add(u128::from(a) * u128::from(b));
        }
        (n as u32, sum)
    }

    /// The same digest as the plain loop for every length from 0 to 300
    /// (every remainder of the two-block loop and of a block), around the
    /// largest frame, and beyond it.
    #[test]
    fn digest_equals_the_plain_loop() {
        let d = FrameDigest::with_seed(0x5eed);
        let mut rng = crate::workload::Rng(9);
        let data: Vec<u8> = (0..MAX_FRAME_BYTES + 40)
            .map(|_| rng.next_u64() as u8)
            .collect();
        let lens = (0..=300).chain(MAX_FRAME_BYTES - 40..=MAX_FRAME_BYTES + 40);
        for len in lens {
            for start in [0, 3] {
                let frame = &data[start..start + len.min(data.len() - start)];
                assert_eq!(d.digest(frame), reference(&d, frame), "len {len}");
            }
        }
    }
}
