//! One rule at a time: arguments, split characters, stop strings, token
//! and byte mismatches, the text and provenance rules, admission, run-level
//! failures, notices, drops, reordering.

use super::*;

#[test]
fn argument_errors() {
    let msg = |e: parallelhue_core::reconcile::ArgError| e.to_string();
    assert_eq!(
        msg(Reconciler::new("ABC", 1).err().unwrap()),
        "invalid run id 'ABC': expected 32 lowercase hex characters"
    );
    assert_eq!(
        msg(Reconciler::new(RUN, 0).err().unwrap()),
        "num_streams 0 out of range 1..=65535"
    );
    let r = Reconciler::new(RUN, 2).unwrap();
    assert_eq!(
        msg(r.check_stream(2).unwrap_err()),
        "stream 2 out of range 0..2"
    );
    assert_eq!(r.check_stream(1), Ok(1));
}

#[test]
fn multibyte_char_split_across_tokens_of_one_step() {
    let mut run = Run::new(1);
    // "é" = c3 a9 split over tokens 11 and 12 of one step.
    run.prov(0, 0, &[10], &[P], 0, 0);
    run.prov(0, 1, &[11, 12, 13], &[A, A, T], 3, 1);
    run.text(0, 0, &[(10, "a", 0)], "a", 0);
    run.text(
        0,
        1,
        &[(11, "", 0), (12, "\u{e9}", 1), (13, "b", 0)],
        "\u{e9}b",
        1,
    );
    run.sse(0, "a", &[10]);
    run.sse(0, "\u{e9}b", &[11, 12, 13]);
    run.finish(0, "stop");
    assert_eq!(
        run.events(),
        vec![
            span(0, 0, "a", Some(0), 0, 1, Some(P)),
            // One step, proven by one input: one span per role.
            span(0, 1, "\u{e9}", Some(1), 1, 2, Some(A)),
            span(0, 3, "b", Some(1), 3, 1, Some(T)),
            Event::Exact { stream: 0 },
        ]
    );
    let st = run.r.stream_stats(0);
    assert_eq!(
        (st.tokens, st.steps, st.accepted, st.target, st.plain),
        (4, 2, 2, 1, 1)
    );
    assert_eq!(st.hist, vec![0, 1, 0, 1]);
    assert_eq!((st.bytes, st.mixed_spans), (4, 0));
}

#[test]
fn char_split_across_steps_is_a_mixed_span_and_sse_releases_it_later() {
    let mut run = Run::new(1);
    // "漢" = e6 bc a2: first byte in step 0, the rest in step 1.
    run.prov(0, 0, &[20], &[P], 0, 0);
    run.text(0, 0, &[(20, "", 0)], "", 0);
    run.sse(0, "", &[20]); // SSE chunk with content "" and a token id
    assert_eq!(run.events(), vec![]);
    run.prov(0, 1, &[21, 22], &[A, B], 1, 1);
    run.text(0, 1, &[(21, "\u{6f22}", 1), (22, "!", 0)], "\u{6f22}!", 1);
    assert_eq!(
        run.events(),
        vec![],
        "nothing proven before SSE has the bytes"
    );
    run.sse(0, "\u{6f22}!", &[21, 22]);
    run.finish(0, "stop");
    assert_eq!(
        run.events(),
        vec![
            span(0, 0, "\u{6f22}", None, 0, 2, None),
            span(0, 3, "!", Some(1), 2, 1, Some(B)),
            Event::Exact { stream: 0 },
        ]
    );
    assert_eq!(run.r.stream_stats(0).mixed_spans, 1);
    assert_eq!(run.r.stream_stats(0).bonus, 1);
}

#[test]
fn an_sse_chunk_ending_inside_a_text_record_fails_once_that_record_is_proven() {
    // SSE text in pieces that do not align with the step: its bytes are proven
    // as they come, then the first chunk's end is a contradiction.
    let mut run = Run::new(1);
    run.prov(0, 0, &[1, 2], &[A, T], 2, 1);
    run.text(0, 0, &[(1, "ab", 0), (2, "cd", 0)], "abcd", 1);
    run.sse(0, "a", &[1]);
    assert_eq!(run.events(), vec![]);
    run.sse(0, "bc", &[2]);
    assert_eq!(run.events(), vec![span(0, 0, "ab", Some(0), 0, 1, Some(A))]);
    run.sse(0, "d", &[]);
    run.finish(0, "stop");
    assert_eq!(
        run.events(),
        vec![
            span(0, 2, "cd", Some(0), 1, 1, Some(T)),
            failed(
                0,
                "stream 0: an SSE chunk ends at offset 1 (byte 1), inside a text record"
            )
        ]
    );
}

#[test]
fn stop_trim_0_26_keeps_ids_truncates_text() {
    // vLLM 0.26: the ids after the stop string stay, the text is cut.
    let mut run = Run::new(1);
    run.prov(0, 0, &[1, 2, 3], &[A, A, T], 3, 0);
    run.text(
        0,
        0,
        &[(1, "ab", 0), (2, "cST", 0), (3, "OP", 0)],
        "abc"
            .as_bytes()
            .iter()
            .map(|&b| b as char)
            .collect::<String>()
            .as_str(),
        1 | 2,
    );
    run.sse(0, "abc", &[1, 2, 3]);
    run.finish(0, "stop");
    assert_eq!(
        run.events(),
        vec![
            span(0, 0, "abc", Some(0), 0, 2, Some(A)),
            Event::Exact { stream: 0 },
        ]
    );
    let st = run.r.stream_stats(0);
    assert_eq!((st.tokens, st.surplus_tokens, st.bytes), (3, 0, 3));
    // The scheduler ran one more step before the abort: surplus, even after exact.
    run.prov(0, 3, &[4], &[T], 1, 1);
    assert_eq!(run.events(), vec![]);
    assert_eq!(run.r.verdict(0), Verdict::Exact);
    assert_eq!(run.r.stream_stats(0).surplus_target, 1);
}

#[test]
fn stop_trim_0_33_deletes_surplus_tokens() {
    // vLLM >= 0.32: tokens after the stop string are deleted from T and SSE;
    // the scheduler's record still has them: surplus.
    let mut run = Run::new(1);
    run.prov(0, 0, &[1, 2, 3, 4], &[A, A, A, B], 3, 0);
    run.prov(0, 4, &[5], &[T], 2, 0);
    run.text_raw(0, 0, &[(1, "ab", 0), (2, "cS", 0)], b"abc", 1 | 2 | 4, 2);
    run.sse(0, "abc", &[1, 2]);
    run.finish(0, "stop");
    assert_eq!(
        run.events(),
        vec![
            span(0, 0, "abc", Some(0), 0, 2, Some(A)),
            Event::Exact { stream: 0 },
        ]
    );
    let st = run.r.stream_stats(0);
    assert_eq!((st.tokens, st.steps), (2, 1));
    assert_eq!(
        (st.accepted, st.surplus_tokens, st.surplus_accepted),
        (2, 3, 1)
    );
    assert_eq!((st.surplus_bonus, st.surplus_target), (1, 1));
    assert_eq!(st.hist, vec![1, 0, 1]);
    assert_eq!(st.drafts_scheduled, 5);
}

#[test]
fn surplus_arriving_after_the_truncated_finish_settles() {
    let mut run = Run::new(1);
    run.text_raw(0, 0, &[(1, "ab", 0)], b"a", 1 | 2 | 4, 1);
    run.prov(0, 0, &[1, 2], &[A, T], 3, 0);
    run.prov(0, 2, &[3], &[T], 3, 0);
    let st = run.r.stream_stats(0);
    assert_eq!(st.tokens, 0, "not settled: SSE has not confirmed token 0");
    run.sse(0, "a", &[1]);
    let st = run.r.stream_stats(0);
    assert_eq!((st.tokens, st.surplus_tokens, st.steps), (1, 2, 1));
    assert_eq!(st.hist, vec![1, 1]);
    run.finish(0, "stop");
    assert_eq!(run.r.verdict(0), Verdict::Exact);
}

#[test]
fn provenance_beyond_the_end_without_truncation_fails() {
    let mut run = Run::new(2);
    run.text(0, 0, &[(1, "a", 0)], "a", 1);
    run.prov(0, 0, &[1, 2], &[A, T], 3, 0);
    assert_eq!(
        last_failure(&run.events()),
        "stream 0: provenance beyond the end of the request at offset 1"
    );
    run.prov(1, 0, &[1, 2], &[A, T], 3, 0);
    run.text(1, 0, &[(1, "a", 0)], "a", 1);
    assert_eq!(
        last_failure(&run.events()),
        "stream 1: provenance beyond the end of the request at offset 1"
    );
}

#[test]
fn token_mismatches() {
    let mut run = Run::new(3);
    run.prov(0, 0, &[1, 2], &[A, T], 3, 0);
    run.text(0, 0, &[(1, "a", 0), (9, "b", 0)], "ab", 0);
    assert_eq!(
        run.events(),
        vec![failed(
            0,
            "token mismatch at offset 1: scheduler 2, detokenizer 9"
        )]
    );
    run.text(1, 0, &[(1, "a", 0), (2, "b", 0)], "ab", 0);
    run.sse(1, "ab", &[1, 7]);
    assert_eq!(
        run.events(),
        vec![failed(
            1,
            "token mismatch at offset 1: detokenizer 2, SSE 7"
        )]
    );
    // SSE first, then text; the scheduler vs SSE pair alone is never compared.
    run.sse(2, "", &[5]);
    run.prov(2, 0, &[6], &[T], 1, 0);
    assert_eq!(run.events(), vec![]);
    run.text(2, 0, &[(6, "x", 0)], "x", 0);
    assert_eq!(
        run.events(),
        vec![failed(
            2,
            "token mismatch at offset 0: detokenizer 6, SSE 5"
        )]
    );
    // Nothing more for a failed stream.
    run.sse(2, "zzz", &[1, 2, 3]);
    run.r.finalize();
    assert_eq!(run.events(), Vec::<Event>::new());
}

#[test]
fn byte_mismatches() {
    let mut run = Run::new(2);
    run.prov(0, 0, &[1, 2], &[A, T], 3, 1);
    run.text(0, 0, &[(1, "ab", 0), (2, "cd", 0)], "abXd", 1);
    run.sse(0, "abXd", &[1, 2]);
    assert_eq!(
        run.events(),
        vec![
            span(0, 0, "ab", Some(0), 0, 1, Some(A)),
            failed(
                0,
                "byte mismatch at offset 1 (byte 2): detokenizer fragment vs HTTP delta"
            )
        ]
    );
    run.prov(1, 0, &[1, 2], &[A, T], 3, 1);
    run.text(1, 0, &[(1, "ab", 0), (2, "cd", 0)], "abcd", 1);
    run.sse(1, "abcD", &[1, 2]);
    assert_eq!(
        run.events(),
        vec![
            span(1, 0, "ab", Some(0), 0, 1, Some(A)),
            failed(1, "byte mismatch at offset 1 (byte 3): HTTP delta vs SSE")
        ]
    );
}

#[test]
fn text_stream_rules() {
    let mut run = Run::new(6);
    // span_back beyond the pending empties.
    run.text(0, 0, &[(1, "", 0), (2, "x", 2)], "x", 0);
    assert_eq!(
        last_failure(&run.events()),
        "stream 0: span_back 2 at offset 1 exceeds 1 pending tokens"
    );
    // A non-empty fragment ends the pending run.
    run.text(
        1,
        0,
        &[(1, "", 0), (2, "x", 0), (3, "", 0), (4, "y", 2)],
        "xy",
        0,
    );
    assert_eq!(
        last_failure(&run.events()),
        "stream 1: span_back 2 at offset 3 exceeds 1 pending tokens"
    );
    // HTTP beyond the fragments.
    run.text(2, 0, &[(1, "a", 0)], "ab", 0);
    assert_eq!(
        last_failure(&run.events()),
        "stream 2: HTTP text extends beyond the detokenized fragments at byte 1"
    );
    // Offsets must be contiguous; nothing after finish.
    run.text(3, 1, &[(1, "a", 0)], "a", 0);
    assert_eq!(
        last_failure(&run.events()),
        "text offset 1 for stream 3, expected 0"
    );
    run.text(4, 0, &[(1, "a", 0)], "a", 1);
    run.text(4, 1, &[(2, "b", 0)], "b", 0);
    assert_eq!(last_failure(&run.events()), "stream 4: text after finish");
    // SSE beyond the final HTTP text.
    run.text(5, 0, &[(1, "a", 0)], "a", 1);
    run.sse(5, "ab", &[1]);
    assert_eq!(
        last_failure(&run.events()),
        "stream 5: SSE text extends beyond the HTTP text at byte 1"
    );
}

#[test]
fn provenance_rules_and_second_sources() {
    let mut run = Run::new(3);
    run.prov(0, 2, &[1], &[P], 0, 0);
    assert_eq!(
        last_failure(&run.events()),
        "provenance offset 2 for stream 0, expected 0"
    );
    run.prov(1, 0, &[1], &[P], 0, 0);
    let mut other = Sender::new(run_id(), 0xcccc);
    run.r
        .push_frame(&other.hello(&HelloFields::simulated(ROLE_SCHEDULER, 3)));
    let rec = ProvRec {
        stream: 1,
        flags: 0,
        finish_reason: 0,
        offset: 1,
        drafts_scheduled: 0,
        drafts_padded: 0,
        token_ids: vec![2],
        roles: vec![P],
    };
    run.r.push_frame(&other.provenance(1, &[rec]));
    assert_eq!(
        last_failure(&run.events()),
        "stream 1: provenance from a second source 000000000000cccc"
    );
    assert_eq!(run.r.sources().len(), 3);
    assert_eq!(run.r.verdict(2), Verdict::Pending);
}

#[test]
fn admission_rejections_and_counters() {
    let mut run = Run::new(2);
    // Undecodable.
    run.r.push_frame(b"short");
    // Foreign run.
    let mut foreign = Sender::new([7; 16], 0x1234);
    run.r
        .push_frame(&foreign.hello(&HelloFields::simulated(ROLE_SCHEDULER, 0)));
    // Second hello (seq 1) from the scheduler.
    let h2 = run.sched.hello(&HelloFields::simulated(ROLE_SCHEDULER, 3));
    run.r.push_frame(&h2);
    // Duplicate of that frame.
    run.r.push_frame(&h2);
    // Foreign record: stream 5 of a 2-stream run.
    run.prov(5, 0, &[1], &[P], 0, 0);
    assert_eq!(
        run.events(),
        vec![
            Event::Run {
                message: "rejected frame: truncated frame: 5 bytes, header needs 64".into()
            },
            Event::Run {
                message: format!(
                    "rejected frame: frame for run {}, expected {RUN}",
                    "07".repeat(16)
                )
            },
            Event::Run {
                message: "rejected frame: second hello from source 000000000000aaaa".into()
            },
        ]
    );
    let c = run.r.counters();
    assert_eq!(
        (
            c.frames,
            c.rejected_frames,
            c.duplicate_frames,
            c.foreign_records
        ),
        (7, 3, 1, 1)
    );
    assert_eq!(run.r.verdict(0), Verdict::Pending);
}

#[test]
fn run_level_failures() {
    // A frontend sending provenance.
    let mut run = Run::new(2);
    let rec = ProvRec {
        stream: 0,
        flags: 0,
        finish_reason: 0,
        offset: 0,
        drafts_scheduled: 0,
        drafts_padded: 0,
        token_ids: vec![1],
        roles: vec![P],
    };
    let f = run.front.provenance(1, std::slice::from_ref(&rec));
    run.r.push_frame(&f);
    let msg = "source 000000000000bbbb: provenance frame from a frontend source";
    assert_eq!(
        run.events(),
        vec![
            Event::Run {
                message: msg.into()
            },
            failed(0, msg),
            failed(1, msg)
        ]
    );
    // A source whose first frame is not a hello.
    let mut r = Reconciler::new(RUN, 1).unwrap();
    let mut s = Sender::new(run_id(), 0x77);
    r.push_frame(&s.notice(0, &[(0, 5, "x")]));
    let msg = "source 0000000000000077: notice frame before its hello";
    assert_eq!(
        r.drain(),
        vec![
            Event::Run {
                message: msg.into()
            },
            failed(0, msg)
        ]
    );
}

#[test]
fn notices() {
    let mut run = Run::new(3);
    let f = run
        .front
        .notice(1, &[(1, 1, "stream_interval is 4"), (9, 2, "n")]);
    run.r.push_frame(&f);
    assert_eq!(
        run.events(),
        vec![failed(
            1,
            "not exact: stream_interval is 4 (notice 1 from source 000000000000bbbb)"
        )]
    );
    assert_eq!(run.r.counters().foreign_records, 1);
    let f = run.sched.notice(2, &[(0xFFFF, 4, "vLLM 0.20 unsupported")]);
    run.r.push_frame(&f);
    let m = "not exact: vLLM 0.20 unsupported (notice 4 from source 000000000000aaaa)";
    assert_eq!(run.events(), vec![failed(0, m), failed(2, m)]);
}

#[test]
fn dropped_counter_fails_every_stream_without_a_final_verdict() {
    let mut run = Run::new(2);
    run.prov(0, 0, &[1], &[P], 0, 1);
    run.text(0, 0, &[(1, "a", 0)], "a", 1);
    run.sse(0, "a", &[1]);
    run.finish(0, "stop");
    assert_eq!(run.r.verdict(0), Verdict::Exact);
    run.events();
    run.sched.dropped = 3;
    run.prov(1, 0, &[1], &[P], 0, 0);
    // The exact stream is revoked too: a lost frame may have been a notice for it.
    let m = "frames lost: source 000000000000aaaa dropped 3 frames before seq 2";
    assert_eq!(run.events(), vec![failed(0, m), failed(1, m)]);
    assert_eq!(run.r.counters().dropped_reported, 3);
    // After finalize() a loss changes nothing.
    let mut run = Run::new(1);
    run.prov(0, 0, &[1], &[P], 0, 1);
    run.text(0, 0, &[(1, "a", 0)], "a", 1);
    run.sse(0, "a", &[1]);
    run.finish(0, "stop");
    run.r.finalize();
    run.sched.dropped = 3;
    run.prov(0, 1, &[2], &[P], 0, 0);
    assert_eq!(run.r.verdict(0), Verdict::Exact);
}

#[test]
fn reordering_within_the_window_is_harmless_and_gaps_fail() {
    let wl = generate(&WorkloadConfig {
        streams: 4,
        tokens_per_stream: 600,
        ..Default::default()
    });
    // Swap frames pairwise (reordering by one) and duplicate some.
    let mut frames = Vec::new();
    let mut sse = Vec::new();
    for i in &wl.inputs {
        match i {
            parallelhue_core::workload::Input::Frame(f) => frames.push(f.clone()),
            other => sse.push(other.clone()),
        }
    }
    let mut r = Reconciler::with_run_id(wl.run_id, 4);
    let mut shuffled = frames.clone();
    for pair in shuffled.chunks_mut(5) {
        pair.reverse();
    }
    for (i, f) in shuffled.iter().enumerate() {
        r.push_frame(f);
        if i % 7 == 0 {
            r.push_frame(f);
        }
    }
    feed_inputs(&sse, &mut r);
    let ev = r.drain();
    assert_eq!(
        ev.iter()
            .filter(|e| matches!(e, Event::Exact { .. }))
            .count(),
        4,
        "{:?}",
        ev.iter().find(|e| matches!(e, Event::Failed { .. }))
    );
    assert!(r.counters().duplicate_frames > 0);
    assert_eq!(r.counters().gaps, 0);

    // Lose the scheduler's frame with seq 5: more than 64 frames pile up.
    let mut r = Reconciler::with_run_id(wl.run_id, 4);
    let lost = frames
        .iter()
        .position(|f| f[24..32] == 0x5c4e_d000_0000_0001u64.to_le_bytes() && f[32] == 5)
        .unwrap();
    for (i, f) in frames.iter().enumerate() {
        if i != lost {
            r.push_frame(f);
        }
    }
    let ev = r.drain();
    assert!(ev.contains(&failed(
        0,
        "frames lost: gap in source 5c4ed00000000001 at seq 5"
    )));
    assert_eq!(r.counters().gaps, 1);
}
