//! The `advance` skips (`prove.rs`, `advance_is_noop_after_*`) against a
//! reconciler that never skips: the same inputs must give the same events
//! after every input, and the same verdicts, statistics and counters.

use super::*;
use crate::workload::{feed_inputs, generate, split_deltas, Input, Rng, Workload, WorkloadConfig};

/// Each frame (and, with `all`, each input) moved later by up to `delay`
/// places (a stable sort on `index + jitter`): SSE deltas before the text
/// records that confirm them, frames out of sequence; with `all` also a
/// stream's deltas out of order (a lie) when the delay is long.
pub(super) fn jitter(inputs: Vec<Input>, delay: u64, all: bool, seed: u64) -> Vec<Input> {
    let mut rng = Rng(seed);
    let mut keyed: Vec<(u64, Input)> = inputs
        .into_iter()
        .enumerate()
        .map(|(i, input)| {
            let moves = all || matches!(input, Input::Frame(_));
            let later = if moves { rng.range(0, delay) } else { 0 };
            (i as u64 + later, input)
        })
        .collect();
    keyed.sort_by_key(|(k, _)| *k);
    keyed.into_iter().map(|(_, input)| input).collect()
}

/// One differential case's workload: `streams` streams of 300 tokens,
/// `coalesce` steps per chunk, then [`jitter`] (salted seed) and, with
/// `split`, each delta cut in two.
pub(super) fn case_inputs(
    streams: u16,
    coalesce: u32,
    seed: u64,
    (delay, all, split): (u64, bool, bool),
    salt: u64,
) -> (Workload, Vec<Input>) {
    let w = generate(&WorkloadConfig {
        streams,
        tokens_per_stream: 300,
        coalesce,
        seed,
        ..WorkloadConfig::default()
    });
    let mut inputs = jitter(w.inputs.clone(), delay, all, seed ^ salt);
    if split {
        inputs = split_deltas(inputs);
    }
    (w, inputs)
}

/// Every `every`-th delta one character longer than the text it stands for.
pub(super) fn lie(mut inputs: Vec<Input>, every: usize) -> Vec<Input> {
    let mut n = 0;
    for input in &mut inputs {
        if let Input::Sse { text, .. } = input {
            n += 1;
            if n % every == 0 {
                text.push('x');
            }
        }
    }
    inputs
}

#[test]
fn skipped_advance_changes_no_event() {
    let streams = 8u16;
    let mut skipped = [0u64; 3];
    let (mut exact, mut failed, mut spans) = (0, 0, 0);
    for (coalesce, delay, all, split, every) in [
        (1, 0, false, false, 0),
        (1, 12, false, false, 0),
        (1, 30, false, false, 0),
        (2, 20, false, false, 0),
        (1, 6, true, false, 0),
        (1, 12, false, true, 0),
        (1, 20, false, false, 97),
        (3, 25, false, true, 131),
        (1, 40, true, false, 0),
        (1, 400, false, false, 0),
    ] {
        for seed in [3, 29] {
            let (w, mut inputs) = case_inputs(streams, coalesce, seed, (delay, all, split), 0x5eed);
            if every > 0 {
                inputs = lie(inputs, every);
            }
            let mut skipping = Reconciler::with_run_id(w.run_id, streams);
            let mut always = Reconciler::with_run_id(w.run_id, streams);
            always.skip_advance = false;
            let case = format!(
                "coalesce {coalesce}, delay {delay} (all {all}), split {split}, lie {every}"
            );
            for (i, input) in inputs.iter().enumerate() {
                feed_inputs(std::slice::from_ref(input), &mut skipping);
                feed_inputs(std::slice::from_ref(input), &mut always);
                let (a, b) = (skipping.drain(), always.drain());
                assert_eq!(a, b, "{case}: events after input {i}");
                spans += a.iter().filter(|e| matches!(e, Event::Span { .. })).count();
            }
            skipping.finalize();
            always.finalize();
            assert_eq!(skipping.drain(), always.drain(), "{case}: finalize");
            for s in 0..streams {
                let v = skipping.verdict(s);
                assert_eq!(v, always.verdict(s), "{case}: stream {s}");
                assert_eq!(skipping.stream_stats(s), always.stream_stats(s), "{case}");
                match v {
                    Verdict::Exact => exact += 1,
                    Verdict::Failed(_) => failed += 1,
                    Verdict::Pending => {}
                }
            }
            assert_eq!(skipping.counters(), always.counters(), "{case}");
            assert_eq!(always.skipped, [0; 3]);
            for (total, n) in skipped.iter_mut().zip(skipping.skipped) {
                *total += n;
            }
        }
    }
    // Each skip was taken many times, on streams that ended exact and on
    // streams that failed.
    assert!(
        skipped.iter().all(|&n| n > 1_000) && exact > 40 && failed > 20 && spans > 10_000,
        "skipped {skipped:?}, {exact} exact, {failed} failed, {spans} spans"
    );
}

/// The skips after text and SSE inputs while a fragment waits for bytes
/// (`Stream::front_still_waits`), against a reconciler that never skips.
/// The HTTP text holds back each step's last fragment until the next step
/// (as a detokenizer holding an incomplete stop string does), and the SSE
/// deltas repeat the HTTP deltas: a confirmed fragment waits for the next
/// step's bytes, which the next text record and SSE delta bring in either
/// order, before or after the next provenance.
#[test]
fn skips_while_a_fragment_waits_for_bytes() {
    use crate::encode::{HelloFields, ProvRec, Sender, TextRec, TextTok};
    use crate::protocol::{ROLE_ACCEPTED, ROLE_TARGET};
    let run_id = [7u8; 16];
    // The frontend's hello has no speculative fields.
    let hello = |role| {
        let spec = role == ROLE_SCHEDULER;
        HelloFields {
            role,
            engine: 2,
            role_derivation: u8::from(spec),
            async_scheduling: false,
            num_speculative_tokens: if spec { 2 } else { 0 },
            verification: u16::from(spec),
            plugin_version: "0.1.0".into(),
            engine_version: "sim".into(),
            spec_method: if spec { "ngram".into() } else { String::new() },
        }
    };
    let (streams, steps) = (3u16, 60u32);
    let mut sched = Sender::new(run_id, 1);
    let mut front = Sender::new(run_id, 2);
    let mut inputs = vec![
        Input::Frame(sched.hello(&hello(ROLE_SCHEDULER))),
        Input::Frame(front.hello(&hello(ROLE_FRONTEND))),
    ];
    let frag = |stream: u16, o: u32| {
        let c = (b'a' + ((o + u32::from(stream)) % 26) as u8) as char;
        format!("{c}{c}")
    };
    let mut held = vec![String::new(); streams as usize];
    for j in 0..steps {
        let (o, step) = (2 * j, u64::from(j) + 1);
        let prov: Vec<ProvRec> = (0..streams)
            .map(|stream| ProvRec {
                stream,
                offset: o,
                drafts_scheduled: 2,
                token_ids: vec![o + 100, o + 101],
                roles: vec![ROLE_ACCEPTED, ROLE_TARGET],
                ..ProvRec::default()
            })
            .collect();
        let mut deltas = Vec::new();
        let text: Vec<TextRec> = (0..streams)
            .map(|stream| {
                let (a, b) = (frag(stream, o), frag(stream, o + 1));
                // The HTTP delta: what was held back, this step's first
                // fragment; the second is held back until the next step.
                let http = std::mem::replace(&mut held[stream as usize], b.clone());
                let http = format!("{http}{a}");
                deltas.push(Input::Sse {
                    stream,
                    text: http.clone(),
                    token_ids: vec![o + 100, o + 101],
                });
                TextRec {
                    stream,
                    offset: o,
                    tokens: [(o + 100, a), (o + 101, b)]
                        .into_iter()
                        .map(|(token_id, f)| TextTok {
                            token_id,
                            fragment: f.into_bytes(),
                            span_back: 0,
                            lead_len: 0,
                        })
                        .collect(),
                    http: http.into_bytes(),
                    ..TextRec::default()
                }
            })
            .collect();
        let p = Input::Frame(sched.provenance(step, &prov));
        let t = Input::Frame(front.text(step, &text));
        match j % 4 {
            0 => inputs.extend([p, t].into_iter().chain(deltas)),
            1 => inputs.extend(deltas.into_iter().chain([p, t])),
            2 => inputs.extend([t].into_iter().chain(deltas).chain([p])),
            _ => inputs.extend([p].into_iter().chain(deltas).chain([t])),
        }
    }
    let mut skipping = Reconciler::with_run_id(run_id, streams);
    let mut always = Reconciler::with_run_id(run_id, streams);
    always.skip_advance = false;
    let mut spans = 0;
    for (i, input) in inputs.iter().enumerate() {
        feed_inputs(std::slice::from_ref(input), &mut skipping);
        feed_inputs(std::slice::from_ref(input), &mut always);
        let (a, b) = (skipping.drain(), always.drain());
        assert_eq!(a, b, "events after input {i}");
        assert!(
            !a.iter()
                .any(|e| matches!(e, Event::Failed { .. } | Event::Run { .. })),
            "input {i}: {a:?}"
        );
        spans += a.iter().filter(|e| matches!(e, Event::Span { .. })).count();
    }
    for s in 0..streams {
        assert_eq!(skipping.stream_stats(s), always.stream_stats(s));
    }
    skipping.finalize();
    always.finalize();
    assert_eq!(skipping.drain(), always.drain(), "finalize");
    // Every step but the last proves the previous step's held fragment.
    assert!(
        skipping.skipped_waiting > u64::from(streams) * u64::from(steps) / 4
            && spans >= usize::from(streams) * (steps as usize - 1),
        "{} skipped waiting, {spans} spans",
        skipping.skipped_waiting
    );
}
