//! Finalize's rules in order, empty answers, and whole generated workloads
//! (one chunk per step, coalesced chunks, bounded memory).

use super::*;

type Setup = Box<dyn Fn(&mut Run)>;

#[test]
fn finalize_rules_in_order() {
    // Rule 1: a source with buffered frames.
    let mut run = Run::new(1);
    run.sched.next_seq = 3;
    run.prov(0, 0, &[1], &[P], 0, 0);
    run.r.finalize();
    assert_eq!(
        last_failure(&run.events()),
        "frames lost: gap in source 000000000000aaaa at seq 1"
    );
    // ... which revokes an exact stream too: the lost frame may have been its notice.
    let mut run = Run::new(1);
    run.prov(0, 0, &[1], &[P], 0, 1);
    run.text(0, 0, &[(1, "a", 0)], "a", 1);
    run.sse(0, "a", &[1]);
    run.finish(0, "stop");
    assert_eq!(run.events().last(), Some(&Event::Exact { stream: 0 }));
    run.sched.next_seq += 1;
    run.prov(0, 1, &[2], &[P], 0, 0);
    assert_eq!(run.events(), vec![]);
    run.r.finalize();
    let lost = "frames lost: gap in source 000000000000aaaa at seq 2";
    assert_eq!(run.events(), vec![failed(0, lost)]);
    assert_eq!(run.r.verdict(0), Verdict::Failed(lost.into()));
    // Rule 2: nothing admitted.
    let mut r = Reconciler::new(RUN, 1).unwrap();
    r.push_sse_id(0, &chunk_id(0));
    r.push_sse(0, "a", &[1]);
    r.finish_sse(0, Some("stop"));
    r.finalize();
    assert_eq!(
        last_failure(&r.drain()),
        "missing telemetry: no frames received for this run"
    );
    let cases: Vec<(&str, Setup)> = vec![
        ("stream 0: SSE did not finish", Box::new(|_| {})),
        (
            "missing telemetry: no provenance for offset 1",
            Box::new(|run| {
                run.prov(0, 0, &[1], &[P], 0, 0);
                run.text(0, 0, &[(1, "a", 0), (2, "b", 0)], "ab", 0);
                run.finish(0, "stop");
            }),
        ),
        (
            "missing telemetry: no text frame for offset 1",
            Box::new(|run| {
                run.prov(0, 0, &[1, 2], &[A, T], 3, 0);
                run.text(0, 0, &[(1, "a", 0)], "a", 0);
                run.sse(0, "ab", &[1, 2]);
                run.finish(0, "stop");
            }),
        ),
        (
            "missing telemetry: text not finished at offset 1",
            Box::new(|run| {
                run.prov(0, 0, &[1], &[P], 0, 0);
                run.text(0, 0, &[(1, "a", 0)], "a", 0);
                run.sse(0, "a", &[1]);
                run.finish(0, "stop");
            }),
        ),
        (
            "missing telemetry: the scheduler did not finish the request at offset 1",
            Box::new(|run| {
                run.prov(0, 0, &[1], &[P], 0, 0);
                run.text(0, 0, &[(1, "a", 0)], "a", 1);
                run.sse(0, "a", &[1]);
                run.finish(0, "stop");
            }),
        ),
        (
            "stream 0: SSE text shorter than the HTTP text (1 of 2 bytes)",
            Box::new(|run| {
                run.prov(0, 0, &[1], &[P], 0, 1);
                run.text(0, 0, &[(1, "ab", 0)], "ab", 1);
                run.sse(0, "a", &[1]);
                run.finish(0, "stop");
            }),
        ),
        (
            "stream 0: 1 SSE tokens, 2 detokenized tokens",
            Box::new(|run| {
                run.prov(0, 0, &[1, 2], &[A, T], 3, 1);
                run.text(0, 0, &[(1, "a", 0), (2, "", 0)], "a", 1);
                run.sse(0, "a", &[1]);
                run.finish(0, "stop");
            }),
        ),
    ];
    for (want, setup) in cases {
        let mut run = Run::new(1);
        setup(&mut run);
        assert_eq!(run.r.verdict(0), Verdict::Pending, "{want}");
        run.r.finalize();
        assert_eq!(last_failure(&run.events()), want);
        assert_eq!(run.r.verdict(0), Verdict::Failed(want.into()));
    }
}

#[test]
fn special_tokens_with_empty_fragments_are_never_claimed() {
    let mut run = Run::new(1);
    run.prov(0, 0, &[1, 2, 3], &[A, A, B], 2, 1);
    run.text(0, 0, &[(1, "", 0), (2, "x", 0), (3, "y", 0)], "xy", 1);
    run.sse(0, "xy", &[1, 2, 3]);
    run.finish(0, "stop");
    assert_eq!(
        run.events(),
        vec![
            span(0, 0, "x", Some(0), 1, 1, Some(A)),
            span(0, 1, "y", Some(0), 2, 1, Some(B)),
            Event::Exact { stream: 0 }
        ]
    );
    assert_eq!(run.r.stream_stats(0).tokens, 3);
}

#[test]
fn an_empty_response_is_never_exact() {
    // No token, no scheduler record: nothing was proven, so nothing is exact.
    let mut run = Run::new(1);
    run.text(0, 0, &[], "", 1);
    run.finish(0, "stop");
    assert_eq!(run.events(), vec![]);
    run.r.finalize();
    assert_eq!(
        last_failure(&run.events()),
        "missing telemetry: the scheduler did not finish the request at offset 0"
    );
}

fn check_workload(cfg: WorkloadConfig) {
    let wl = generate(&cfg);
    let mut r = Reconciler::with_run_id(wl.run_id, cfg.streams);
    let mut texts = vec![String::new(); cfg.streams as usize];
    let mut exact = 0;
    let mut mixed = 0;
    for chunk in wl.inputs.chunks(97) {
        feed_inputs(chunk, &mut r);
        for e in r.drain() {
            match e {
                Event::Span {
                    stream,
                    byte_start,
                    text,
                    step,
                    ..
                } => {
                    assert_eq!(byte_start as usize, texts[stream as usize].len());
                    texts[stream as usize].push_str(&text);
                    mixed += u32::from(step.is_none());
                }
                Event::Exact { .. } => exact += 1,
                other => panic!("{other:?}"),
            }
        }
    }
    assert_eq!(exact, cfg.streams);
    assert_eq!(texts, wl.texts);
    assert!(mixed > 0, "the workload splits characters across steps");
    let t = r.totals();
    assert_eq!(t.tokens, wl.total_tokens);
    assert_eq!(t.mixed_spans, u64::from(mixed));
    assert_eq!(t.plain, u64::from(cfg.streams));
    assert_eq!(t.plain + t.accepted + t.target + t.bonus, t.tokens);
    assert_eq!(r.retained(), (0, 0), "nothing kept after the verdicts");
}

#[test]
fn workload_one_chunk_per_step() {
    check_workload(WorkloadConfig {
        streams: 8,
        tokens_per_stream: 500,
        ..Default::default()
    });
}

#[test]
fn workload_coalesced_chunks() {
    check_workload(WorkloadConfig {
        streams: 8,
        tokens_per_stream: 500,
        coalesce: 4,
        seed: 7,
        ..Default::default()
    });
}

#[test]
fn memory_stays_bounded_while_streaming() {
    let cfg = WorkloadConfig {
        streams: 2,
        tokens_per_stream: 20_000,
        ..Default::default()
    };
    let wl = generate(&cfg);
    let mut r = Reconciler::with_run_id(wl.run_id, cfg.streams);
    let mut peak = (0, 0);
    for i in &wl.inputs {
        feed_inputs(std::slice::from_ref(i), &mut r);
        r.drain();
        let (t, b) = r.retained();
        peak = (peak.0.max(t), peak.1.max(b));
    }
    // Well under the 40 000 tokens / ~80 kB of text that went through.
    assert!(peak.0 < 64, "tokens retained {peak:?}");
    assert!(peak.1 < 4_096, "bytes retained {peak:?}");
}

#[test]
fn fragments_of_one_step_proven_by_different_inputs_stay_separate_spans() {
    // The HTTP text of step 1 holds back "zw": those fragments are proven by
    // step 2's chunk, "y" by step 1's.
    let mut run = Run::new(1);
    run.prov(0, 0, &[1, 2, 3], &[A, A, B], 2, 0);
    run.text(0, 0, &[(1, "y", 0), (2, "z", 0), (3, "w", 0)], "y", 0);
    run.sse(0, "y", &[1, 2, 3]);
    run.prov(0, 3, &[4], &[P], 0, 1);
    run.text(0, 3, &[(4, "!", 0)], "zw!", 1);
    run.sse(0, "zw!", &[4]);
    run.finish(0, "stop");
    // Merging never spans two inputs, so it cannot depend on when events are drained.
    assert_eq!(
        run.events(),
        vec![
            span(0, 0, "y", Some(0), 0, 1, Some(A)),
            span(0, 1, "z", Some(0), 1, 1, Some(A)),
            span(0, 2, "w", Some(0), 2, 1, Some(B)),
            span(0, 3, "!", Some(1), 3, 1, Some(P)),
            Event::Exact { stream: 0 }
        ]
    );
}
