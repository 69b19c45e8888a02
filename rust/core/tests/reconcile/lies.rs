//! Lying senders (issue 9): the honest run, and one lie each that must fail
//! its stream with its reason and never be exact.

use super::*;

/// Knobs of the honest run of [`honest`]: each lie changes one.
#[derive(Clone)]
struct Honest {
    p_flags: u8,
    p_reason: u8,
    t_reason: u8,
    second_p_step: Option<u64>,
    second_t_step: Option<u64>,
    sse_reason: Option<&'static str>,
    sse_ids: Vec<u32>,
    /// Usage chunks after the last delta: (completion_tokens, accepted, drafted).
    usage: Vec<UsageChunk>,
}

type UsageChunk = (Option<u64>, Option<&'static [u32]>, Option<&'static [u32]>);

impl Default for Honest {
    fn default() -> Self {
        Honest {
            p_flags: 1,
            p_reason: 1,
            t_reason: 1,
            second_p_step: None,
            second_t_step: None,
            sse_reason: Some("stop"),
            sse_ids: vec![11, 12],
            usage: Vec::new(),
        }
    }
}

fn prov_rec(stream: u16, offset: u32, ids: &[u32], roles: &[u8], ds: u16) -> ProvRec {
    ProvRec {
        stream,
        offset,
        drafts_scheduled: ds,
        token_ids: ids.to_vec(),
        roles: roles.to_vec(),
        ..ProvRec::default()
    }
}

fn text_rec(stream: u16, offset: u32, toks: &[(u32, &str)], http: &str) -> TextRec {
    TextRec {
        stream,
        offset,
        tokens: toks
            .iter()
            .map(|(id, frag)| TextTok {
                token_id: *id,
                fragment: frag.as_bytes().to_vec(),
                ..TextTok::default()
            })
            .collect(),
        http: http.as_bytes().to_vec(),
        ..TextRec::default()
    }
}

/// Stream 0: "Hi" (plain), then " a" "b" (accepted, bonus), finished with stop.
fn honest(run: &mut Run, h: Honest) {
    run.prov(0, 0, &[10], &[P], 0, 0);
    run.text(0, 0, &[(10, "Hi", 0)], "Hi", 0);
    run.sse(0, "Hi", &[10]);
    let mut p = prov_rec(0, 1, &[11, 12], &[A, B], 1);
    (p.flags, p.finish_reason) = (h.p_flags, h.p_reason);
    let step = h.second_p_step.unwrap_or(run.step);
    run.step += 1;
    let f = run.sched.provenance(step, &[p]);
    run.r.push_frame(&f);
    let mut t = text_rec(0, 1, &[(11, " a"), (12, "b")], " ab");
    (t.flags, t.finish_reason) = (1, h.t_reason);
    let step = h.second_t_step.unwrap_or(run.t_step);
    run.t_step += 1;
    let f = run.front.text(step, &[t]);
    run.r.push_frame(&f);
    run.sse(0, " ab", &h.sse_ids);
    run.ids_sent[0] = true;
    for &(n, accepted, drafted) in &h.usage {
        run.r.push_sse_usage(0, n, accepted, drafted);
    }
    run.r.finish_sse(0, h.sse_reason);
}

/// The honest run with these usage chunks after its last delta.
fn with_usage(usage: Vec<UsageChunk>) -> Honest {
    Honest {
        usage,
        ..Honest::default()
    }
}

fn hello_with(role: u8, k: u16, engine_version: &str) -> HelloFields {
    let mut h = HelloFields::simulated(role, k);
    h.engine_version = engine_version.into();
    h
}

type Lie = Box<dyn Fn(&mut Run)>;

/// The lie table: (what the sender lies about, the run with that one lie,
/// the failure it must give). A data table, long by design: one row per lie,
/// each read on its own.
fn lies() -> Vec<(&'static str, Lie, String)> {
    let s0 = "stream 0: ";
    vec![
        (
            "a second record of a stream in one step",
            Box::new(|run: &mut Run| {
                let h = Honest {
                    second_p_step: Some(1),
                    ..Honest::default()
                };
                honest(run, h)
            }),
            format!("{s0}two provenance records in step 1"),
        ),
        (
            "provenance steps going back",
            Box::new(|run: &mut Run| {
                run.step = 5;
                run.prov(0, 0, &[10], &[P], 0, 0);
                let f = run
                    .sched
                    .provenance(2, &[prov_rec(0, 1, &[11, 12], &[A, B], 1)]);
                run.r.push_frame(&f);
            }),
            format!("{s0}provenance step 2 before step 5"),
        ),
        (
            "a second text record in one step",
            Box::new(|run: &mut Run| {
                let h = Honest {
                    second_t_step: Some(1),
                    ..Honest::default()
                };
                honest(run, h)
            }),
            format!("{s0}two text records in step 1"),
        ),
        (
            "text steps going back",
            Box::new(|run: &mut Run| {
                run.t_step = 5;
                run.text(0, 0, &[(10, "Hi", 0)], "Hi", 0);
                let f = run.front.text(1, &[text_rec(0, 1, &[(11, " a")], " a")]);
                run.r.push_frame(&f);
            }),
            format!("{s0}text step 1 before step 5"),
        ),
        (
            "provenance after a finished record",
            Box::new(|run: &mut Run| {
                run.prov(0, 0, &[10], &[P], 0, 1);
                run.prov(0, 1, &[11], &[P], 0, 0);
            }),
            format!("{s0}provenance at offset 1 after the scheduler finished the request"),
        ),
        (
            "provenance after a trimmed record",
            Box::new(|run: &mut Run| {
                run.prov(0, 0, &[10], &[A], 1, 2);
                run.prov(0, 1, &[11], &[P], 0, 0);
            }),
            format!("{s0}provenance at offset 1 after a trimmed step"),
        ),
        (
            "text beyond the scheduler's finish",
            Box::new(|run: &mut Run| {
                run.prov(0, 0, &[10], &[P], 0, 1);
                run.text(0, 0, &[(10, "H", 0), (11, "i", 0)], "Hi", 1);
            }),
            format!("{s0}text token at offset 1 after the scheduler's last step ended at offset 1"),
        ),
        (
            "SSE beyond the scheduler's finish",
            Box::new(|run: &mut Run| {
                run.prov(0, 0, &[10], &[P], 0, 1);
                run.sse(0, "Hi", &[10, 11]);
            }),
            format!("{s0}SSE token at offset 1 after the scheduler's last step ended at offset 1"),
        ),
        (
            "scheduler and detokenizer finish reasons differ",
            Box::new(|run: &mut Run| {
                let h = Honest {
                    p_reason: 2,
                    ..Honest::default()
                };
                honest(run, h)
            }),
            format!(
                "{s0}the scheduler finished the request with 'length', the detokenizer with 'stop'"
            ),
        ),
        (
            "an aborted request",
            Box::new(|run: &mut Run| {
                let h = Honest {
                    t_reason: 3,
                    ..Honest::default()
                };
                honest(run, h)
            }),
            format!("{s0}the detokenizer finished the request with 'abort'"),
        ),
        (
            "the SSE finish_reason differs",
            Box::new(|run: &mut Run| {
                let h = Honest {
                    sse_reason: Some("length"),
                    ..Honest::default()
                };
                honest(run, h)
            }),
            format!("{s0}SSE finish_reason 'length', the detokenizer finished with 'stop'"),
        ),
        (
            "no SSE finish_reason",
            Box::new(|run: &mut Run| {
                let h = Honest {
                    sse_reason: None,
                    ..Honest::default()
                };
                honest(run, h)
            }),
            format!("{s0}SSE finish_reason null, the detokenizer finished with 'stop'"),
        ),
        (
            "SSE tokens beyond the requests's end",
            Box::new(|run: &mut Run| {
                let h = Honest {
                    sse_ids: vec![11, 12, 13],
                    ..Honest::default()
                };
                honest(run, h)
            }),
            format!("{s0}SSE token at offset 3 after the scheduler's last step ended at offset 3"),
        ),
        (
            "a duplicate with other content",
            Box::new(|run: &mut Run| {
                let seq = run.sched.next_seq;
                run.prov(0, 0, &[10], &[P], 0, 0);
                run.sched.next_seq = seq;
                run.prov(0, 0, &[11], &[P], 0, 0);
            }),
            "source 000000000000aaaa: seq 1 received twice with different content".into(),
        ),
        (
            "drafts beyond the hello's K",
            Box::new(|run: &mut Run| run.prov(1, 0, &[1, 2], &[A, T], 4, 0)),
            "stream 1: 4 drafts scheduled at offset 0, the scheduler's hello says K 3".into(),
        ),
        (
            "speculative roles under a hello without speculative decoding",
            Box::new(|run: &mut Run| {
                *run = Run::with_hellos(2, &hello_with(ROLE_SCHEDULER, 0, "sim-1"), "sim-1");
                honest(run, Honest::default())
            }),
            format!("{s0}1 drafts scheduled at offset 1, the scheduler's hello says K 0"),
        ),
        (
            "the two hellos name different engine versions",
            Box::new(|run: &mut Run| {
                *run = Run::with_hellos(2, &hello_with(ROLE_SCHEDULER, 3, "sim-1"), "sim-2");
                honest(run, Honest::default())
            }),
            format!(
                "{s0}the scheduler's and the frontend's hellos disagree on engine_version \
                 ('sim-1' vs 'sim-2')"
            ),
        ),
        (
            "text_truncated but the HTTP text is whole",
            Box::new(|run: &mut Run| {
                run.prov(0, 0, &[10], &[P], 0, 0);
                run.text(0, 0, &[(10, "Hi", 0)], "Hi", 1 | 2);
            }),
            format!(
                "{s0}text_truncated, but the HTTP text is not shorter than the fragments (2 of 2 bytes)"
            ),
        ),
        (
            "a stop-string finish without a token",
            Box::new(|run: &mut Run| run.text_raw(0, 0, &[], b"", 1 | 4, 0)),
            format!("{s0}a stop-string finish without any token"),
        ),
        (
            "trimmed tokens not matching the scheduler's step",
            Box::new(|run: &mut Run| {
                run.prov(0, 0, &[10, 11, 12], &[A, A, B], 2, 0);
                run.text(0, 0, &[(10, "Hi<", 0)], "Hi", 1 | 2);
            }),
            format!(
                "{s0}the text ends at offset 1 with 0 trimmed tokens, the scheduler's step \
                 holding offset 0 ends at offset 3"
            ),
        ),
        (
            "a second choice",
            Box::new(|run: &mut Run| {
                run.sse(0, "Hi", &[10]);
                run.r.push_sse_choice(0, 1);
            }),
            format!("{s0}SSE chunk with a choice other than the single choice 0 (index 1)"),
        ),
        (
            "usage.completion_tokens",
            Box::new(|run: &mut Run| honest(run, with_usage(vec![(Some(5), None, None)]))),
            format!("{s0}usage.completion_tokens 5, but the SSE carried 3 tokens"),
        ),
        (
            "usage.completion_tokens before the tokens it counts",
            Box::new(|run: &mut Run| {
                run.r.push_sse_usage(0, Some(3), None, None);
                honest(run, Honest::default())
            }),
            format!("{s0}usage.completion_tokens 3, but the SSE carried 0 tokens"),
        ),
        (
            "a wrong usage count, corrected by the next usage chunk",
            Box::new(|run: &mut Run| {
                honest(
                    run,
                    with_usage(vec![(Some(2), None, None), (Some(3), None, None)]),
                )
            }),
            format!("{s0}usage.completion_tokens 2, but the SSE carried 3 tokens"),
        ),
        (
            "vLLM's metrics contradicting the records, then a usage chunk without them",
            Box::new(|run: &mut Run| {
                run.r.push_sse_usage(0, None, Some(&[0]), Some(&[1]));
                honest(run, with_usage(vec![(Some(3), None, None)]))
            }),
            format!(
                "{s0}vLLM's per-request metrics disagree at verify step 0: 0 accepted of 1 \
                 drafted, the scheduler's step at offset 1 says 1 of 1"
            ),
        ),
        (
            "vLLM's metrics restated differently",
            Box::new(|run: &mut Run| {
                run.r.push_sse_usage(0, None, Some(&[0]), Some(&[1]));
                run.r.push_sse_usage(0, None, Some(&[1]), Some(&[1]));
                honest(run, Honest::default())
            }),
            format!("{s0}vLLM's per-request metrics differ between two usage chunks"),
        ),
        (
            "a chunk id of another stream",
            Box::new(|run: &mut Run| {
                run.ids_sent[0] = true;
                run.r.push_sse_id(0, &format!("chatcmpl-ph1_{RUN}_01"));
            }),
            format!("{s0}SSE chunk id does not carry the request id ph1_{RUN}_0"),
        ),
        (
            "a prefill/decode router's chunk id",
            Box::new(|run: &mut Run| {
                run.ids_sent[0] = true;
                run.r.push_sse_id(
                    0,
                    &format!(
                        "chatcmpl-___prefill_addr_http://10.0.0.1:8001___decode_addr_\
                         http://10.0.0.1:8002_9f1c2d3e-ph1_{RUN}_01"
                    ),
                );
            }),
            format!(
                "{s0}SSE chunk id does not carry the request id ph1_{RUN}_0 (a prefill/decode \
                 router renamed the request)"
            ),
        ),
        (
            "a chunk id that changes",
            Box::new(|run: &mut Run| {
                run.sse(0, "Hi", &[10]);
                run.r.push_sse_id(0, &format!("{}-other", chunk_id(0)));
            }),
            format!("{s0}SSE chunk id changed mid-stream"),
        ),
        (
            "no chunk id",
            Box::new(|run: &mut Run| {
                run.ids_sent[0] = true;
                honest(run, Honest::default())
            }),
            format!("{s0}no SSE chunk id"),
        ),
        (
            "SSE data after the end",
            Box::new(|run: &mut Run| {
                honest(run, Honest::default());
                run.r.push_sse(0, "!", &[]);
            }),
            format!("{s0}SSE data after the stream finished"),
        ),
        (
            "an SSE chunk ending inside a step",
            Box::new(|run: &mut Run| {
                run.prov(0, 0, &[10], &[P], 0, 0);
                run.text(0, 0, &[(10, "Hi", 0)], "Hi", 0);
                // " a" moved from step 2's chunk into step 1's (ids stay).
                run.sse(0, "Hi a", &[10]);
                let p = prov_rec(0, 1, &[11, 12], &[A, B], 1);
                let (mut p, mut t) = (p, text_rec(0, 1, &[(11, " a"), (12, "b")], " ab"));
                (p.flags, p.finish_reason, t.flags, t.finish_reason) = (1, 1, 1, 1);
                let f = run.sched.provenance(run.step, &[p]);
                run.r.push_frame(&f);
                let f = run.front.text(run.t_step, &[t]);
                run.r.push_frame(&f);
                run.sse(0, "b", &[11, 12]);
                run.finish(0, "stop");
            }),
            format!("{s0}an SSE chunk ends at offset 1 (byte 4), inside a text record"),
        ),
        (
            "a second hello that differs",
            Box::new(|run: &mut Run| {
                let f = run.sched.hello(&HelloFields::simulated(ROLE_SCHEDULER, 7));
                run.r.push_frame(&f);
                honest(run, Honest::default())
            }),
            "source 000000000000aaaa: a second hello that differs from its first".into(),
        ),
        (
            "a loss after the verdict",
            Box::new(|run: &mut Run| {
                honest(run, Honest::default());
                run.sched.dropped = 1;
                run.prov(1, 0, &[1], &[P], 0, 0);
            }),
            "frames lost: source 000000000000aaaa dropped 1 frames before seq 3".into(),
        ),
        (
            "vLLM's metrics: another drafted count",
            metrics(Some(&[1]), Some(&[2])),
            format!(
                "{s0}vLLM's per-request metrics disagree at verify step 0: 1 accepted of 2 \
                 drafted, the scheduler's step at offset 1 says 1 of 1"
            ),
        ),
        (
            "vLLM's metrics: another accepted count",
            metrics(Some(&[0]), Some(&[1])),
            format!(
                "{s0}vLLM's per-request metrics disagree at verify step 0: 0 accepted of 1 \
                 drafted, the scheduler's step at offset 1 says 1 of 1"
            ),
        ),
        (
            "vLLM's metrics: another number of steps",
            metrics(Some(&[1, 0]), Some(&[1, 1])),
            format!(
                "{s0}vLLM's per-request metrics list 2 verify steps, the scheduler sent 1 \
                 steps with drafts"
            ),
        ),
        (
            "vLLM's metrics: lists of two lengths",
            metrics(Some(&[1]), Some(&[1, 1])),
            format!("{s0}vLLM's per-request metrics list 1 accepted and 2 drafted steps"),
        ),
        (
            "vLLM's metrics: one list",
            metrics(None, Some(&[1])),
            format!(
                "{s0}vLLM's per-request metrics carry per_step_drafted without per_step_accepted"
            ),
        ),
        (
            "vLLM's metrics without the scheduler's finish",
            Box::new(|run: &mut Run| {
                run.prov(0, 0, &[10], &[P], 0, 0);
                run.text(0, 0, &[(10, "Hi<", 0)], "Hi", 1 | 2);
                run.sse(0, "Hi", &[10]);
                run.r.push_sse_usage(0, Some(1), Some(&[]), Some(&[]));
                run.finish(0, "stop");
            }),
            "missing telemetry: the scheduler did not finish the request at offset 1".into(),
        ),
    ]
}

fn metrics(accepted: Option<&'static [u32]>, drafted: Option<&'static [u32]>) -> Lie {
    Box::new(move |run: &mut Run| {
        // Before any SSE token: a count would have to be 0 (it counts the SSE tokens so far).
        run.r.push_sse_usage(0, None, accepted, drafted);
        honest(run, Honest::default())
    })
}

#[test]
fn vllm_metrics_that_agree_are_counted_including_a_trimmed_steps_precut_acceptance() {
    let mut run = Run::new(2);
    metrics(Some(&[1]), Some(&[1]))(&mut run);
    assert_eq!(run.r.verdict(0), Verdict::Exact);
    assert_eq!(run.r.stream_stats(0).metrics_steps, 1);
    // max_tokens cut a step of 3 accepted drafts after 1: vLLM counts 3, the record 1.
    let mut run = Run::new(1);
    run.prov(0, 0, &[10], &[P], 0, 0);
    run.text(0, 0, &[(10, "H", 0)], "H", 0);
    let mut p = prov_rec(0, 1, &[11], &[A], 3);
    (p.flags, p.finish_reason) = (1 | 2, 2);
    let f = run.sched.provenance(9, &[p]);
    run.r.push_frame(&f);
    let mut t = text_rec(0, 1, &[(11, "i")], "i");
    (t.flags, t.finish_reason) = (1, 2);
    let f = run.front.text(9, &[t]);
    run.r.push_frame(&f);
    run.sse(0, "Hi", &[10, 11]);
    run.r.push_sse_usage(0, Some(2), Some(&[3]), Some(&[3]));
    run.finish(0, "length");
    assert_eq!(run.r.verdict(0), Verdict::Exact);
    assert_eq!(run.r.totals().metrics_steps, 1);
}

impl Run {
    /// A run of `streams` with the given scheduler hello and a frontend hello
    /// naming `front_version`.
    fn with_hellos(streams: u32, sched: &HelloFields, front_version: &str) -> Run {
        let mut run = Run {
            r: Reconciler::new(RUN, streams).unwrap(),
            sched: Sender::new(run_id(), 0xaaaa),
            front: Sender::new(run_id(), 0xbbbb),
            step: 1,
            t_step: 1,
            ids_sent: vec![false; streams as usize],
        };
        let h = run.sched.hello(sched);
        run.r.push_frame(&h);
        let h = run
            .front
            .hello(&hello_with(ROLE_FRONTEND, 0, front_version));
        run.r.push_frame(&h);
        run
    }
}

#[test]
fn the_honest_run_of_the_lie_table_is_exact() {
    let mut run = Run::new(2);
    honest(&mut run, Honest::default());
    assert_eq!(run.r.verdict(0), Verdict::Exact);
}

#[test]
fn a_lying_sender_fails_the_stream_with_its_reason_and_never_exact() {
    for (name, lie, reason) in lies() {
        let mut run = Run::new(2);
        lie(&mut run);
        run.r.finalize();
        let events = run.events();
        let stream = u16::from(reason.starts_with("stream 1:"));
        assert!(
            events.contains(&failed(stream, &reason)),
            "{name}: {reason:?} not in {events:?}"
        );
        assert_eq!(
            run.r.verdict(stream),
            Verdict::Failed(reason.clone()),
            "{name}"
        );
        if !["SSE data after the end", "a loss after the verdict"].contains(&name) {
            assert!(!events.contains(&Event::Exact { stream }), "{name}");
        }
    }
}

#[test]
fn a_late_notice_revokes_and_finality_counts_late_frames() {
    let mut run = Run::new(1);
    honest(&mut run, Honest::default());
    assert_eq!(run.r.verdict(0), Verdict::Exact);
    run.events();
    let f = run.front.notice(9, &[(0, 3, "late hook failure")]);
    run.r.push_frame(&f);
    let reason = "not exact: late hook failure (notice 3 from source 000000000000bbbb)";
    assert_eq!(run.events(), vec![failed(0, reason)]);
    run.r.finalize();
    let f = run.front.notice(10, &[(0, 3, "after the end")]);
    run.r.push_frame(&f);
    run.r.push_frame(&f);
    assert_eq!(
        run.events(),
        vec![Event::Run {
            message: parallelhue_core::reconcile::LATE_MESSAGE.into()
        }]
    );
    assert_eq!(run.r.counters().late_frames, 2);
    assert_eq!(run.r.verdict(0), Verdict::Failed(reason.into()));
}

#[test]
fn an_impossible_acceptance_is_a_rejected_frame_not_a_figure() {
    let mut run = Run::new(1);
    let mut p = prov_rec(0, 0, &[10, 11], &[A, T], 2);
    p.drafts_padded = 2;
    let f = run.sched.provenance(1, &[p]);
    run.r.push_frame(&f);
    assert_eq!(
        run.events(),
        vec![Event::Run {
            message:
                "rejected frame: record for stream 0: 1 accepted drafts exceed 2 scheduled minus 2 padded"
                    .into()
        }]
    );
    assert_eq!(run.r.stream_stats(0).accepted, 0);
}

#[test]
fn usage_chunks_that_repeat_themselves_add_nothing_and_lose_nothing() {
    // vLLM's continuous usage (a running count in every chunk) and the final
    // usage chunk with the per-step lists, repeated: exact, cross-checked.
    let mut run = Run::new(2);
    let lists: (Option<&'static [u32]>, Option<&'static [u32]>) = (Some(&[1]), Some(&[1]));
    honest(
        &mut run,
        with_usage(vec![
            (Some(3), lists.0, lists.1),
            (Some(3), None, None),
            (Some(3), lists.0, lists.1),
        ]),
    );
    assert_eq!(run.r.verdict(0), Verdict::Exact);
    assert_eq!(run.r.stream_stats(0).metrics_steps, 1);
}
