//! `prove.rs`'s helpers against plain versions of them: `Stream::pieces`
//! against the character-by-character walk it replaced (kept here as the
//! reference), for random fragments with span_back, per-token gives or only
//! lead_len, multi-byte characters across unit boundaries, a reach before
//! the first claimed token, and cuts at the final HTTP text; `same3` against
//! `==`.

use super::prove::{is_continuation, same3, Piece};
use super::*;
use crate::workload::Rng;

/// The walk `pieces` did before it took the characters inside a unit at once.
fn reference(st: &Stream, fr: &Frag, avail: usize) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    let len = fr.len as usize;
    let span_back = (fr.tok - fr.first) as u32;
    let frag = st.f.slice(fr.byte_start, fr.byte_start + len as u64);
    let lead = usize::from(fr.lead);
    let unit_count = if fr.gives { span_back as usize + 1 } else { 2 };
    let unit = |u: usize| -> (u64, u64, usize, usize) {
        if !fr.gives {
            return if u == 0 {
                (fr.first, fr.tok, 0, lead)
            } else {
                (fr.tok, fr.tok + 1, lead, len)
            };
        }
        if u == span_back as usize {
            return (fr.tok, fr.tok + 1, lead, len);
        }
        (fr.first + u as u64, fr.first + u as u64 + 1, 0, 0)
    };
    let mut starts = Vec::new();
    if fr.gives {
        let mut at = 0usize;
        for o in fr.first..fr.tok {
            starts.push(at);
            at += usize::from(st.tok(o).give);
        }
        starts.push(at);
        starts.push(len);
    }
    let range = |u: usize| -> (u64, u64, usize, usize) {
        let (a, b, from, to) = unit(u);
        if fr.gives {
            (a, b, starts[u], starts[u + 1])
        } else {
            (a, b, from, to)
        }
    };
    let mut first_unit = 0usize;
    let mut pos = 0usize;
    while pos < avail {
        let mut end = pos + 1;
        while end < len && is_continuation(frag[end]) {
            end += 1;
        }
        while first_unit + 1 < unit_count && range(first_unit).3 <= pos {
            first_unit += 1;
        }
        let mut last_unit = first_unit;
        while last_unit + 1 < unit_count && range(last_unit + 1).2 < end {
            last_unit += 1;
        }
        let low = if fr.reach < fr.first {
            fr.reach
        } else {
            range(first_unit).0
        };
        let high = range(last_unit).1;
        let end = end.min(avail);
        match out.last_mut() {
            Some(p) if p.first == low && u64::from(p.n) == high - low => p.to = end,
            _ => {
                let (step, role) = st.shared(low, high);
                out.push(Piece {
                    from: pos,
                    to: end,
                    step,
                    role,
                    first: low,
                    n: (high - low) as u32,
                });
            }
        }
        pos = end;
    }
    out
}

#[test]
fn pieces_equal_the_character_walk() {
    const CHARS: [&str; 7] = ["a", "b", "\u{e9}", "\u{20ac}", "\u{4e2d}", "\u{1f600}", " "];
    let mut rng = Rng(20261202);
    let (mut multi, mut cut, mut gives_cases) = (0, 0, 0);
    for case in 0..20_000u64 {
        let mut text = String::new();
        for _ in 0..rng.range(1, 8) {
            text.push_str(CHARS[rng.range(0, CHARS.len() as u64 - 1) as usize]);
        }
        let bytes = text.as_bytes();
        let len = bytes.len();
        let span_back = rng.range(1, 6);
        let first = rng.range(0, 3);
        let tok = first + span_back;
        let mut st = Stream::default();
        // Tokens 0..=tok: steps and roles that sometimes differ.
        for o in 0..=tok {
            let t = st.slot(o);
            t.ord = (o / rng.range(1, 3)) as u32;
            t.role = rng.range(0, 1) as u8;
        }
        // Gives adding up to lead (zeros and a whole lead on one token included).
        let lead = rng.range(0, len as u64) as usize;
        let gives = case % 3 != 0;
        let mut left = lead;
        for o in first..tok {
            let g = if o + 1 == tok {
                left
            } else {
                rng.range(0, left as u64) as usize
            };
            left -= g;
            st.slot(o).give = g as u16;
        }
        let pad = rng.range(0, 5) as usize;
        st.f.extend(&vec![b'x'; pad]);
        st.f.extend(bytes);
        // Sometimes an unclaimed token of unknown give before the first.
        let reach = if case % 5 == 0 {
            rng.range(0, first)
        } else {
            first
        };
        let fr = Frag {
            tok,
            first,
            reach,
            byte_start: pad as u64,
            len: len as u32,
            lead: lead as u16,
            gives,
        };
        // The whole fragment, or a cut at a character boundary before its end.
        let avail = if case % 4 == 0 {
            let bounds: Vec<usize> = (1..=len).filter(|&i| text.is_char_boundary(i)).collect();
            bounds[rng.range(0, bounds.len() as u64 - 1) as usize]
        } else {
            len
        };
        let (mut out, mut starts) = (Vec::new(), Vec::new());
        st.pieces(&fr, avail, &mut out, &mut starts);
        let want = reference(&st, &fr, avail);
        assert_eq!(
            format!("{out:?}"),
            format!("{want:?}"),
            "case {case}: {text:?} first {first} tok {tok} lead {lead} gives {gives} avail {avail}"
        );
        multi += usize::from(want.len() > 1);
        cut += usize::from(avail < len);
        gives_cases += usize::from(gives);
    }
    assert!(
        multi > 5_000 && cut > 3_000 && gives_cases > 10_000,
        "{multi} {cut} {gives_cases}"
    );
}

/// `same3` is `a == b && b == c` at every length around its word paths
/// (0 to 40 bytes), with one byte changed anywhere in any of the three.
#[test]
fn same3_is_two_equalities() {
    let mut rng = Rng(7);
    let mut differ = 0;
    for n in 0..=40usize {
        let base: Vec<u8> = (0..n).map(|_| rng.range(0, 255) as u8).collect();
        assert!(same3(&base, &base.clone(), &base.clone()), "n {n}");
        for at in 0..n {
            for which in 0..3 {
                let mut v = [base.clone(), base.clone(), base.clone()];
                v[which][at] ^= 1 << rng.range(0, 7);
                let want = v[0] == v[1] && v[1] == v[2];
                assert_eq!(same3(&v[0], &v[1], &v[2]), want, "n {n} at {at} in {which}");
                differ += usize::from(!want);
            }
        }
    }
    assert_eq!(differ, 3 * (0..=40).sum::<usize>());
}
