//! Per-stream and run statistics (docs/PROTOCOL.md "Statistics").

use crate::protocol::{ROLE_ACCEPTED, ROLE_BONUS, ROLE_PLAIN, ROLE_TARGET};

/// Statistics of one stream, or their sum over the run. Laid out (`repr(C)`,
/// on cache-line boundaries) so that settling a record touches the first
/// two lines and a span the second: the counters every record adds to, then
/// the lists' headers with the span counters, then the rest; the order of
/// the protocol's keys is [`STAT_KEYS`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct Stats {
    /// Confirmed tokens of settled records.
    pub tokens: u64,
    /// Settled records with at least one confirmed token.
    pub steps: u64,
    pub drafts_scheduled: u64,
    pub drafts_padded: u64,
    pub plain: u64,
    pub accepted: u64,
    pub target: u64,
    pub bonus: u64,
    /// `hist[n]`: settled records with `n` confirmed tokens (grown on demand).
    pub hist: Vec<u64>,
    /// `drafts_by_pos[i]`: settled records with more than `i` unpadded draft
    /// slots (grown on demand, so its length is the largest
    /// `drafts_scheduled - drafts_padded` seen).
    pub drafts_by_pos: Vec<u64>,
    /// Span events whose step is None.
    pub mixed_spans: u64,
    /// Bytes in span events.
    pub bytes: u64,
    /// `accepted_by_pos[i]`: settled records whose draft `i` was accepted and
    /// confirmed (same length as `drafts_by_pos`).
    pub accepted_by_pos: Vec<u64>,
    pub surplus_tokens: u64,
    pub surplus_accepted: u64,
    pub surplus_target: u64,
    pub surplus_bonus: u64,
    pub surplus_plain: u64,
    /// Steps cross-checked with vLLM's per-request speculative metrics.
    pub metrics_steps: u64,
}

/// The keys of a stats dict, in the protocol's order.
pub const STAT_KEYS: [&str; 19] = [
    "tokens",
    "steps",
    "hist",
    "drafts_scheduled",
    "drafts_padded",
    "plain",
    "accepted",
    "target",
    "bonus",
    "surplus_tokens",
    "surplus_accepted",
    "surplus_target",
    "surplus_bonus",
    "surplus_plain",
    "mixed_spans",
    "bytes",
    "drafts_by_pos",
    "accepted_by_pos",
    "metrics_steps",
];

/// Element-wise `a += b`, growing `a` to `b`'s length.
fn add_lists(a: &mut Vec<u64>, b: &[u64]) {
    if a.len() < b.len() {
        a.resize(b.len(), 0);
    }
    for (x, y) in a.iter_mut().zip(b) {
        *x += *y;
    }
}

impl Stats {
    /// What every settled record adds whatever its roles: its step, its place
    /// in the histogram, its drafts (shared by `settle` and `settle_confirmed`).
    #[inline(always)]
    fn settle_record(&mut self, confirmed: usize, ds: u16, dp: u16) {
        if confirmed > 0 {
            self.steps += 1;
        }
        if self.hist.len() <= confirmed {
            self.hist.resize(confirmed + 1, 0);
        }
        self.hist[confirmed] += 1;
        self.drafts_scheduled += u64::from(ds);
        self.drafts_padded += u64::from(dp);
        self.tokens += confirmed as u64;
        let drafts = usize::from(ds - dp);
        if self.drafts_by_pos.len() < drafts {
            self.drafts_by_pos.resize(drafts, 0);
            self.accepted_by_pos.resize(drafts, 0);
        }
        for d in &mut self.drafts_by_pos[..drafts] {
            *d += 1;
        }
    }

    /// Account one settled provenance record: `roles[..confirmed]` are its
    /// confirmed tokens, the rest surplus.
    pub fn settle(&mut self, roles: impl Iterator<Item = u8>, confirmed: usize, ds: u16, dp: u16) {
        self.settle_record(confirmed, ds, dp);
        // Accepted drafts come first: position i is the i-th accepted token.
        let mut position = 0usize;
        for (i, role) in roles.enumerate() {
            if i < confirmed {
                match role {
                    ROLE_PLAIN => self.plain += 1,
                    ROLE_ACCEPTED => {
                        self.accepted += 1;
                        self.accepted_by_pos[position] += 1;
                        position += 1;
                    }
                    ROLE_TARGET => self.target += 1,
                    ROLE_BONUS => self.bonus += 1,
                    _ => {}
                }
            } else {
                self.surplus_tokens += 1;
                match role {
                    ROLE_PLAIN => self.surplus_plain += 1,
                    ROLE_ACCEPTED => self.surplus_accepted += 1,
                    ROLE_TARGET => self.surplus_target += 1,
                    ROLE_BONUS => self.surplus_bonus += 1,
                    _ => {}
                }
            }
        }
    }

    /// [`Stats::settle`] of a record whose `confirmed` tokens are all
    /// confirmed, from its role counts (`counts[r]`: tokens with role `r`,
    /// for the four roles 0..=3): the same sums without walking the tokens. Equal because with
    /// every token confirmed `settle` adds one to `counts[r]`'s counter per
    /// token of role r, and the i-th accepted token (whatever its place) to
    /// `accepted_by_pos[i]`, i.e. one to each of the first `counts[1]`
    /// positions (test `settle_confirmed_is_settle_of_every_token`).
    #[inline]
    pub fn settle_confirmed(&mut self, confirmed: usize, counts: [u16; 4], ds: u16, dp: u16) {
        self.settle_record(confirmed, ds, dp);
        let [plain, accepted, target, bonus] = counts.map(u64::from);
        self.plain += plain;
        self.accepted += accepted;
        self.target += target;
        self.bonus += bonus;
        for a in &mut self.accepted_by_pos[..counts[1] as usize] {
            *a += 1;
        }
    }

    /// Add another stream's statistics.
    pub fn add(&mut self, o: &Stats) {
        self.tokens += o.tokens;
        self.steps += o.steps;
        add_lists(&mut self.hist, &o.hist);
        self.drafts_scheduled += o.drafts_scheduled;
        self.drafts_padded += o.drafts_padded;
        self.plain += o.plain;
        self.accepted += o.accepted;
        self.target += o.target;
        self.bonus += o.bonus;
        self.surplus_tokens += o.surplus_tokens;
        self.surplus_accepted += o.surplus_accepted;
        self.surplus_target += o.surplus_target;
        self.surplus_bonus += o.surplus_bonus;
        self.surplus_plain += o.surplus_plain;
        self.mixed_spans += o.mixed_spans;
        self.bytes += o.bytes;
        add_lists(&mut self.drafts_by_pos, &o.drafts_by_pos);
        add_lists(&mut self.accepted_by_pos, &o.accepted_by_pos);
        self.metrics_steps += o.metrics_steps;
    }

    /// `(tokens per record, records)` for every non-zero histogram bin.
    pub fn hist_items(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.hist
            .iter()
            .enumerate()
            .filter(|(_, &n)| n != 0)
            .map(|(k, &n)| (k, n))
    }

    /// accepted / (drafts_scheduled − drafts_padded), when that is non-zero.
    pub fn acceptance_rate(&self) -> Option<f64> {
        let d = self.drafts_scheduled.saturating_sub(self.drafts_padded);
        (d != 0).then(|| self.accepted as f64 / d as f64)
    }
}

/// Run counters (docs/PROTOCOL.md "Statistics").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Every datagram pushed, rejected and late ones included.
    pub frames: u64,
    pub rejected_frames: u64,
    pub duplicate_frames: u64,
    pub foreign_records: u64,
    pub dropped_reported: u64,
    pub gaps: u64,
    /// Datagrams pushed after `finalize()` (not used).
    pub late_frames: u64,
}

impl Counters {
    pub fn items(&self) -> [(&'static str, u64); 7] {
        [
            ("frames", self.frames),
            ("rejected_frames", self.rejected_frames),
            ("duplicate_frames", self.duplicate_frames),
            ("foreign_records", self.foreign_records),
            ("dropped_reported", self.dropped_reported),
            ("gaps", self.gaps),
            ("late_frames", self.late_frames),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every role sequence of up to 7 tokens (roles 0..=4, 4 unknown) with
    /// as many drafts as fit: the role counts settle what the tokens do.
    #[test]
    fn settle_confirmed_is_settle_of_every_token() {
        let mut cases = 0;
        for n in 1..=7u32 {
            for code in 0..5u32.pow(n) {
                let roles: Vec<u8> = (0..n).map(|i| (code / 5u32.pow(i) % 5) as u8).collect();
                let accepted = roles.iter().filter(|&&r| r == ROLE_ACCEPTED).count() as u16;
                for (ds, dp) in [(accepted, 0), (accepted + 1, 1), (accepted + 2, 0)] {
                    let mut counts = [0u16; 4];
                    for &r in &roles {
                        if let Some(c) = counts.get_mut(usize::from(r)) {
                            *c += 1;
                        }
                    }
                    let mut walked = Stats::default();
                    let mut counted = Stats::default();
                    for _ in 0..2 {
                        walked.settle(roles.iter().copied(), roles.len(), ds, dp);
                        counted.settle_confirmed(roles.len(), counts, ds, dp);
                    }
                    assert_eq!(walked, counted, "roles {roles:?}, ds {ds}, dp {dp}");
                    cases += 1;
                }
            }
        }
        assert!(cases > 100_000);
    }
}
