//! Proving a run of fragments at once (`prove.rs` `run_of_fragments`)
//! against a reconciler that proves fragment by fragment: the same inputs
//! must give the same events after every input (span texts, token ranges,
//! steps and roles, failures and their wording), the same packed spans, and
//! the same verdicts, statistics and counters.

use super::skip_tests::{case_inputs, lie};
use super::*;
use crate::workload::{feed_inputs, Input};

/// Every `every`-th text frame with one byte of one record's HTTP delta
/// (`http`) or fragments (else) changed to another ASCII byte: the
/// detokenizer's fragments and the HTTP text disagree inside a run of
/// fragments (the frame stays valid: same length, still UTF-8).
fn lie_in_text(mut inputs: Vec<Input>, every: usize, http: bool) -> Vec<Input> {
    let mut n = 0;
    for input in &mut inputs {
        let Input::Frame(data) = input else { continue };
        let at = match protocol::decode(data) {
            Ok(Frame {
                body: Body::Text(recs),
                ..
            }) => {
                n += 1;
                if n % every != 0 {
                    continue;
                }
                // The last byte of the first record that has an ASCII one.
                recs.iter().find_map(|r| {
                    let bytes = if http {
                        r.http_delta.as_bytes()
                    } else {
                        r.fragments
                    };
                    let i = bytes.iter().rposition(u8::is_ascii_alphabetic)?;
                    Some(bytes[i..].as_ptr() as usize - data.as_ptr() as usize)
                })
            }
            _ => None,
        };
        if let Some(at) = at {
            data[at] = if data[at] == b'#' { b'%' } else { b'#' };
        }
    }
    inputs
}

/// Every `every`-th delta with its first ASCII letter changed (same length):
/// the SSE text disagrees with the HTTP text inside a run.
fn lie_in_sse(mut inputs: Vec<Input>, every: usize) -> Vec<Input> {
    let mut n = 0;
    for input in &mut inputs {
        if let Input::Sse { text, .. } = input {
            n += 1;
            if n % every == 0 {
                if let Some(i) = text.bytes().position(|b| b.is_ascii_alphabetic()) {
                    text.replace_range(i..i + 1, "#");
                }
            }
        }
    }
    inputs
}

#[test]
fn proved_runs_change_no_event() {
    let streams = 8u16;
    let mut runs = [0u64; 2];
    let (mut exact, mut failed, mut spans, mut mismatches) = (0, 0, 0, 0);
    // (coalesce, delay, all inputs jittered, split deltas, extra character
    // every n deltas, changed SSE letter every n, changed HTTP byte every n
    // text frames, changed fragment byte every n)
    for (coalesce, delay, all, split, extra, sse, http, frag) in [
        (1, 0, false, false, 0, 0, 0, 0),
        (1, 12, false, false, 0, 0, 0, 0),
        (3, 0, false, false, 0, 0, 0, 0),
        (2, 20, false, false, 0, 0, 0, 0),
        (1, 6, true, false, 0, 0, 0, 0),
        (1, 12, false, true, 0, 0, 0, 0),
        (1, 20, false, false, 97, 0, 0, 0),
        (4, 25, false, true, 131, 0, 0, 0),
        (1, 0, false, false, 0, 53, 0, 0),
        (3, 10, false, false, 0, 41, 0, 0),
        (1, 0, false, false, 0, 0, 17, 0),
        (2, 8, false, false, 0, 0, 0, 23),
        (1, 40, true, false, 0, 0, 29, 0),
        (1, 400, false, false, 0, 0, 0, 0),
    ] {
        for seed in [5, 31] {
            let (w, mut inputs) = case_inputs(streams, coalesce, seed, (delay, all, split), 0x7a11);
            if extra > 0 {
                inputs = lie(inputs, extra);
            }
            if sse > 0 {
                inputs = lie_in_sse(inputs, sse);
            }
            if http > 0 {
                inputs = lie_in_text(inputs, http, true);
            }
            if frag > 0 {
                inputs = lie_in_text(inputs, frag, false);
            }
            let case = format!(
                "coalesce {coalesce}, delay {delay} (all {all}), split {split}, \
                 lies {extra}/{sse}/{http}/{frag}, seed {seed}"
            );
            // Events mode (span texts and token ranges) and packed mode.
            let mut runs_ev = Reconciler::with_run_id(w.run_id, streams);
            let mut slow_ev = Reconciler::with_run_id(w.run_id, streams);
            let mut runs_pk = Reconciler::with_run_id(w.run_id, streams);
            let mut slow_pk = Reconciler::with_run_id(w.run_id, streams);
            runs_pk.pack_spans();
            slow_pk.pack_spans();
            slow_ev.prove_runs = false;
            slow_pk.prove_runs = false;
            let (mut a_spans, mut b_spans) = (Vec::new(), Vec::new());
            for (i, input) in inputs.iter().enumerate() {
                for r in [&mut runs_ev, &mut slow_ev, &mut runs_pk, &mut slow_pk] {
                    feed_inputs(std::slice::from_ref(input), r);
                }
                let (a, b) = (runs_ev.drain(), slow_ev.drain());
                assert_eq!(a, b, "{case}: events after input {i}");
                spans += a.iter().filter(|e| matches!(e, Event::Span { .. })).count();
                mismatches += a
                    .iter()
                    .filter(|e| matches!(e, Event::Failed { reason, .. } if reason.contains("byte mismatch")))
                    .count();
                assert_eq!(
                    runs_pk.drain(),
                    slow_pk.drain(),
                    "{case}: packed, input {i}"
                );
                runs_pk.take_spans_into(&mut a_spans);
                slow_pk.take_spans_into(&mut b_spans);
                assert_eq!(a_spans, b_spans, "{case}: packed spans after input {i}");
            }
            for r in [&mut runs_ev, &mut slow_ev, &mut runs_pk, &mut slow_pk] {
                r.finalize();
            }
            assert_eq!(runs_ev.drain(), slow_ev.drain(), "{case}: finalize");
            assert_eq!(runs_pk.drain(), slow_pk.drain(), "{case}: finalize");
            for s in 0..streams {
                let v = runs_ev.verdict(s);
                for r in [&slow_ev, &runs_pk, &slow_pk] {
                    assert_eq!(v, r.verdict(s), "{case}: stream {s}");
                    assert_eq!(runs_ev.stream_stats(s), r.stream_stats(s), "{case}");
                }
                match v {
                    Verdict::Exact => exact += 1,
                    Verdict::Failed(_) => failed += 1,
                    Verdict::Pending => {}
                }
            }
            for r in [&slow_ev, &runs_pk, &slow_pk] {
                assert_eq!(runs_ev.counters(), r.counters(), "{case}");
            }
            assert_eq!(slow_ev.runs_proven, [0; 2]);
            assert_eq!(slow_pk.runs_proven, [0; 2]);
            for (total, n) in runs.iter_mut().zip(runs_ev.runs_proven) {
                *total += n;
            }
        }
    }
    // Runs were proven many times and runs differed (the fallback found the
    // mismatch), on streams that ended exact and streams that failed.
    assert!(
        runs[0] > 3_000
            && runs[1] > 10
            && exact > 40
            && failed > 40
            && mismatches > 20
            && spans > 10_000,
        "runs {runs:?}, {exact} exact, {failed} failed, {mismatches} byte mismatches, {spans} spans"
    );
}
