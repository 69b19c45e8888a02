//! Reconciler behaviour (docs/PROTOCOL.md "Reconciliation"), edge cases first.

use parallelhue_core::encode::{HelloFields, ProvRec, Sender, TextRec, TextTok};
use parallelhue_core::protocol::LEAD_UNKNOWN;
use parallelhue_core::reconcile::{Event, Reconciler, Verdict, ROLE_FRONTEND, ROLE_SCHEDULER};
use parallelhue_core::workload::{feed_inputs, generate, WorkloadConfig};

const RUN: &str = "00112233445566778899aabbccddeeff";
const A: u8 = 1; // accepted
const T: u8 = 2; // target
const B: u8 = 3; // bonus
const P: u8 = 0; // plain

/// Builds the frames of one run and feeds them. Each frame gets the next
/// step of its sender (one record per stream and step); the first SSE delta
/// of a stream is preceded by its chunk id, as the SSE readers push it.
struct Run {
    r: Reconciler,
    sched: Sender,
    front: Sender,
    step: u64,
    t_step: u64,
    ids_sent: Vec<bool>,
}

/// The SSE chunk id vLLM gives stream `s` of the run.
fn chunk_id(s: u16) -> String {
    format!("chatcmpl-ph1_{RUN}_{s}")
}

fn run_id() -> [u8; 16] {
    parallelhue_core::reconcile::parse_run_id(RUN).unwrap()
}

impl Run {
    fn new(streams: u32) -> Run {
        let mut run = Run {
            r: Reconciler::new(RUN, streams).unwrap(),
            sched: Sender::new(run_id(), 0xaaaa),
            front: Sender::new(run_id(), 0xbbbb),
            step: 1,
            t_step: 1,
            ids_sent: vec![false; streams as usize],
        };
        let h = run.sched.hello(&HelloFields::simulated(ROLE_SCHEDULER, 3));
        run.r.push_frame(&h);
        let h = run.front.hello(&HelloFields::simulated(ROLE_FRONTEND, 3));
        run.r.push_frame(&h);
        run
    }

    /// Provenance for one stream: (offset, ids, roles, drafts_scheduled, flags).
    fn prov(&mut self, stream: u16, offset: u32, ids: &[u32], roles: &[u8], ds: u16, flags: u8) {
        let rec = ProvRec {
            stream,
            flags,
            finish_reason: if flags & 1 != 0 { 1 } else { 0 },
            offset,
            drafts_scheduled: ds,
            drafts_padded: 0,
            token_ids: ids.to_vec(),
            roles: roles.to_vec(),
        };
        let f = self.sched.provenance(self.step, &[rec]);
        self.step += 1;
        self.r.push_frame(&f);
    }

    /// Text for one stream: tokens (id, fragment, span_back), http delta, flags.
    fn text(&mut self, stream: u16, offset: u32, toks: &[(u32, &str, u8)], http: &str, flags: u8) {
        self.text_raw(stream, offset, toks, http.as_bytes(), flags, 0)
    }

    fn text_raw(
        &mut self,
        stream: u16,
        offset: u32,
        toks: &[(u32, &str, u8)],
        http: &[u8],
        flags: u8,
        trimmed: u16,
    ) {
        let rec = TextRec {
            stream,
            flags,
            finish_reason: if flags & 1 != 0 { 1 } else { 0 },
            offset,
            trimmed_tokens: trimmed,
            tokens: toks
                .iter()
                .map(|(id, frag, back)| TextTok {
                    token_id: *id,
                    fragment: frag.as_bytes().to_vec(),
                    span_back: *back,
                    lead_len: if *back == 0 { 0 } else { LEAD_UNKNOWN },
                })
                .collect(),
            http: http.to_vec(),
        };
        let f = self.front.text(self.t_step, &[rec]);
        self.t_step += 1;
        self.r.push_frame(&f);
    }

    fn sse(&mut self, stream: u16, text: &str, ids: &[u32]) {
        if !std::mem::replace(&mut self.ids_sent[stream as usize], true) {
            self.r.push_sse_id(stream, &chunk_id(stream));
        }
        self.r.push_sse(stream, text, ids);
    }

    fn finish(&mut self, stream: u16, reason: &str) {
        if !std::mem::replace(&mut self.ids_sent[stream as usize], true) {
            self.r.push_sse_id(stream, &chunk_id(stream));
        }
        self.r.finish_sse(stream, Some(reason));
    }

    fn events(&mut self) -> Vec<Event> {
        self.r.drain()
    }
}

fn span(
    stream: u16,
    start: u64,
    text: &str,
    step: Option<u32>,
    first: u64,
    n: u32,
    role: Option<u8>,
) -> Event {
    Event::Span {
        stream,
        byte_start: start,
        text: text.into(),
        step,
        first_offset: first,
        n_tokens: n,
        role,
    }
}

fn failed(stream: u16, reason: &str) -> Event {
    Event::Failed {
        stream,
        reason: reason.into(),
    }
}

fn last_failure(ev: &[Event]) -> String {
    ev.iter()
        .rev()
        .find_map(|e| match e {
            Event::Failed { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

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

// ------------------------------------------ lying senders (issue 9): one lie each

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
fn per_character_attribution_from_lead_len() {
    // "a" + first byte of 日 from token 1 (step 0, plain), the rest of 日 and "b"
    // from token 2 (step 1, accepted): 'a' takes step 0, 日 is mixed, 'b' step 1.
    let mut run = Run::new(1);
    run.prov(0, 0, &[1], &[P], 0, 0);
    run.prov(0, 1, &[2, 3], &[A, T], 2, 1);
    let toks = vec![
        TextTok {
            token_id: 1,
            // Its give count not known: the v2 split by lead_len alone.
            lead_len: LEAD_UNKNOWN,
            ..TextTok::default()
        },
        TextTok {
            token_id: 2,
            fragment: "a\u{65e5}b".as_bytes().to_vec(),
            span_back: 1,
            lead_len: 2,
        },
        TextTok {
            token_id: 3,
            fragment: b"c".to_vec(),
            ..TextTok::default()
        },
    ];
    let rec = TextRec {
        stream: 0,
        flags: 1,
        finish_reason: 1,
        tokens: toks,
        http: "a\u{65e5}bc".as_bytes().to_vec(),
        ..TextRec::default()
    };
    let f = run.front.text(1, &[rec]);
    run.r.push_frame(&f);
    run.sse(0, "a\u{65e5}bc", &[1, 2, 3]);
    run.finish(0, "stop");
    assert_eq!(
        run.events(),
        vec![
            span(0, 0, "a", Some(0), 0, 1, Some(P)),
            span(0, 1, "\u{65e5}", None, 0, 2, None),
            span(0, 4, "b", Some(1), 1, 1, Some(A)),
            span(0, 5, "c", Some(1), 2, 1, Some(T)),
            Event::Exact { stream: 0 },
        ]
    );
    let st = run.r.stream_stats(0);
    assert_eq!((st.mixed_spans, st.bytes), (1, 6));
    assert_eq!(
        (st.drafts_by_pos.clone(), st.accepted_by_pos.clone()),
        (vec![1, 1], vec![1, 0])
    );
}

/// A text token: (id, fragment, span_back, lead_len or give count).
fn tt(token_id: u32, fragment: &[u8], span_back: u8, lead_len: u16) -> TextTok {
    TextTok {
        token_id,
        fragment: fragment.to_vec(),
        span_back,
        lead_len,
    }
}

impl Run {
    /// One text record of stream 0 with explicit token entries.
    fn text_toks(&mut self, offset: u32, tokens: Vec<TextTok>, http: &[u8], finished: bool) {
        let rec = TextRec {
            stream: 0,
            flags: u8::from(finished),
            finish_reason: u8::from(finished),
            offset,
            tokens,
            http: http.to_vec(),
            ..TextRec::default()
        };
        let f = self.front.text(self.t_step, &[rec]);
        self.t_step += 1;
        self.r.push_frame(&f);
    }

    fn failed(&mut self) -> Vec<String> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Failed { reason, .. } => Some(reason),
                _ => None,
            })
            .collect()
    }
}

#[test]
fn give_counts_attribute_each_predecessor_its_own_bytes_across_records() {
    // Issue 9's case: 'Ġthe\xe6' (step 0) gives 5 bytes, '\x97' (step 1) gives 1,
    // the carrier (step 1) returns " the日x" with span_back 2 and lead_len 6. Each
    // empty token comes in its own record (predecessors from earlier steps).
    let mut run = Run::new(1);
    run.prov(0, 0, &[10], &[P], 0, 0);
    run.prov(0, 1, &[11, 12], &[A, B], 1, 1);
    run.text_toks(0, vec![tt(10, b"", 0, 5)], b"", false);
    run.text_toks(1, vec![tt(11, b"", 0, 1)], b"", false);
    run.text_toks(
        2,
        vec![tt(12, " the\u{65e5}x".as_bytes(), 2, 6)],
        " the\u{65e5}x".as_bytes(),
        true,
    );
    run.sse(0, "", &[10]);
    run.sse(0, "", &[11]);
    run.sse(0, " the\u{65e5}x", &[12]);
    run.finish(0, "stop");
    assert_eq!(
        run.events(),
        vec![
            span(0, 0, " the", Some(0), 0, 1, Some(P)),
            span(0, 4, "\u{65e5}", None, 0, 3, None),
            span(0, 7, "x", Some(1), 2, 1, Some(B)),
            Event::Exact { stream: 0 },
        ]
    );
    assert_eq!(run.r.stream_stats(0).mixed_spans, 1);
}

#[test]
fn a_zero_give_inside_a_character_joins_its_tokens_and_lead_may_be_below_span_back() {
    // '\xe6' gives 1 (step 0), a skipped special token gives 0 (step 1), the carrier
    // '\x97\xa5' + "z" (step 1) has span_back 2 and lead_len 1 (below span_back).
    let mut run = Run::new(1);
    run.prov(0, 0, &[20], &[P], 0, 0);
    run.prov(0, 1, &[21, 22], &[A, T], 2, 1);
    let frag = "\u{65e5}z".as_bytes();
    run.text_toks(
        0,
        vec![tt(20, b"", 0, 1), tt(21, b"", 0, 0), tt(22, frag, 2, 1)],
        frag,
        true,
    );
    run.sse(0, "\u{65e5}z", &[20, 21, 22]);
    run.finish(0, "stop");
    assert_eq!(
        run.events(),
        vec![
            span(0, 0, "\u{65e5}", None, 0, 3, None),
            span(0, 3, "z", Some(1), 2, 1, Some(T)),
            Event::Exact { stream: 0 },
        ]
    );
}

#[test]
fn gives_that_do_not_add_up_to_lead_len_fail_the_stream() {
    for (gives, lead, reason) in [
        (
            [5u16, 2],
            6u16,
            "stream 0: the 2 tokens before offset 2 give 7 bytes, its lead_len says 6",
        ),
        (
            [4, 1],
            6,
            "stream 0: the 2 tokens before offset 2 give 5 bytes, its lead_len says 6",
        ),
        (
            [7, LEAD_UNKNOWN],
            6,
            "stream 0: the 2 tokens before offset 2 give 7 bytes, its lead_len says 6",
        ),
    ] {
        let mut run = Run::new(1);
        run.prov(0, 0, &[10, 11, 12], &[A, A, B], 2, 1);
        let frag = " the\u{65e5}x".as_bytes();
        run.text_toks(
            0,
            vec![
                tt(10, b"", 0, gives[0]),
                tt(11, b"", 0, gives[1]),
                tt(12, frag, 2, lead),
            ],
            frag,
            true,
        );
        assert_eq!(run.failed(), vec![reason.to_owned()]);
    }
    // Some gives unknown and the known ones within lead_len: the v2 split, exact.
    let mut run = Run::new(1);
    run.prov(0, 0, &[10, 11, 12], &[A, A, B], 2, 1);
    let frag = " the\u{65e5}x".as_bytes();
    run.text_toks(
        0,
        vec![
            tt(10, b"", 0, 5),
            tt(11, b"", 0, LEAD_UNKNOWN),
            tt(12, frag, 2, 6),
        ],
        frag,
        true,
    );
    run.sse(0, " the\u{65e5}x", &[10, 11, 12]);
    run.finish(0, "stop");
    assert!(run.events().contains(&Event::Exact { stream: 0 }));
}

#[test]
fn a_give_no_fragment_claims_fails_the_stream() {
    // The carrier claims one predecessor; the token before it gave 5 bytes.
    let mut run = Run::new(1);
    run.prov(0, 0, &[10, 11, 12], &[A, A, B], 2, 1);
    let frag = "\u{65e5}x".as_bytes();
    run.text_toks(0, vec![tt(10, b"", 0, 5)], b"", false);
    run.text_toks(1, vec![tt(11, b"", 0, 2), tt(12, frag, 1, 2)], frag, true);
    assert_eq!(
        run.failed(),
        vec!["stream 0: token at offset 0 gave 5 bytes that no fragment carries".to_owned()]
    );
    // A skipped token (give 0) or an unknown give left unclaimed is fine.
    for give in [0, LEAD_UNKNOWN] {
        let mut run = Run::new(1);
        run.prov(0, 0, &[10, 11, 12], &[A, A, B], 2, 1);
        run.text_toks(
            0,
            vec![tt(10, b"", 0, give), tt(11, b"", 0, 2), tt(12, frag, 1, 2)],
            frag,
            true,
        );
        run.sse(0, "\u{65e5}x", &[10, 11, 12]);
        run.finish(0, "stop");
        assert!(
            run.events().contains(&Event::Exact { stream: 0 }),
            "give {give}"
        );
    }
}

#[test]
fn a_give_beyond_the_reach_of_span_back_fails_the_stream() {
    // Token 0 gives a byte, then 255 tokens give nothing: no span_back (at most
    // 255) reaches token 0 from the carrier at offset 256.
    let mut run = Run::new(1);
    let mut toks = vec![tt(1, b"", 0, 1)];
    toks.extend((0..255).map(|_| tt(2, b"", 0, 0)));
    run.text_toks(0, toks, b"", false);
    run.text_toks(256, vec![tt(3, b"ab", 255, 0)], b"ab", true);
    assert_eq!(
        run.failed(),
        vec!["stream 0: token at offset 0 gave 1 bytes that no fragment carries".to_owned()]
    );
}

#[test]
fn pending_gives_at_the_finish_are_held_back_bytes_not_a_contradiction() {
    // The request ends inside a character: vLLM drops the held-back bytes; the
    // sender could not know, at that token's step, that no carrier would come.
    let mut run = Run::new(1);
    run.prov(0, 0, &[10], &[P], 0, 0);
    run.prov(0, 1, &[11], &[P], 0, 1);
    run.text_toks(0, vec![tt(10, b"a", 0, 0)], b"a", false);
    run.text_toks(1, vec![tt(11, b"", 0, 1)], b"", true);
    run.sse(0, "a", &[10]);
    run.sse(0, "", &[11]);
    run.finish(0, "stop");
    assert!(run.events().contains(&Event::Exact { stream: 0 }));
}

/// The text of `tokens` (id, fragment, span_back, lead_len) as one finished
/// record, with its HTTP text, the SSE and its finish: the events.
fn one_text_record(run: &mut Run, tokens: &[(u32, &str, u8, u16)]) -> Vec<Event> {
    let toks: Vec<TextTok> = tokens
        .iter()
        .map(|&(token_id, fragment, span_back, lead_len)| TextTok {
            token_id,
            fragment: fragment.as_bytes().to_vec(),
            span_back,
            lead_len,
        })
        .collect();
    let text: String = tokens.iter().map(|t| t.1).collect();
    let rec = TextRec {
        stream: 0,
        flags: 1,
        finish_reason: 1,
        tokens: toks,
        http: text.as_bytes().to_vec(),
        ..TextRec::default()
    };
    let f = run.front.text(1, &[rec]);
    run.r.push_frame(&f);
    let ids: Vec<u32> = tokens.iter().map(|t| t.0).collect();
    run.sse(0, &text, &ids);
    run.finish(0, "stop");
    run.events()
}

#[test]
fn an_unclaimed_token_of_unknown_give_keeps_the_carriers_characters_uncolored() {
    // Token 1 (step 0) holds bytes back and says its give is unknown; token 2
    // (step 1) claims no predecessor. 你's bytes may be token 1's: every
    // character of the fragment may be, so it is mixed, never step 1's alone.
    let mut run = Run::new(1);
    run.prov(0, 0, &[1], &[P], 0, 0);
    run.prov(0, 1, &[2, 3], &[A, T], 2, 1);
    let events = one_text_record(
        &mut run,
        &[
            (1, "", 0, LEAD_UNKNOWN),
            (2, "\u{4f60}b", 0, 0),
            (3, "c", 0, 0),
        ],
    );
    assert_eq!(
        events,
        vec![
            span(0, 0, "\u{4f60}b", None, 0, 2, None),
            span(0, 4, "c", Some(1), 2, 1, Some(T)),
            Event::Exact { stream: 0 },
        ]
    );
    // The same with the unclaimed token in the carrier's step (and role): every
    // value its give could take gives the same step, so it is colored.
    let mut run = Run::new(1);
    run.prov(0, 0, &[1], &[P], 0, 0);
    run.prov(0, 1, &[2, 3, 4], &[A, A, T], 3, 1);
    let events = one_text_record(
        &mut run,
        &[
            (1, "a", 0, 0),
            (2, "", 0, LEAD_UNKNOWN),
            (3, "\u{4f60}b", 0, 0),
            (4, "c", 0, 0),
        ],
    );
    assert_eq!(
        events,
        vec![
            span(0, 0, "a", Some(0), 0, 1, Some(P)),
            span(0, 1, "\u{4f60}b", Some(1), 1, 2, Some(A)),
            span(0, 5, "c", Some(1), 3, 1, Some(T)),
            Event::Exact { stream: 0 },
        ]
    );
    // Claimed predecessors with known gives, and an earlier unclaimed one of
    // unknown give: every character's tokens start at the unclaimed one.
    let mut run = Run::new(1);
    run.prov(0, 0, &[1, 2], &[A, T], 2, 0);
    run.prov(0, 2, &[3, 4], &[A, T], 2, 1);
    let events = one_text_record(
        &mut run,
        &[
            (1, "", 0, LEAD_UNKNOWN),
            (2, "", 0, 1),
            (3, "xy", 1, 1),
            (4, "z", 0, 0),
        ],
    );
    assert_eq!(
        events,
        vec![
            span(0, 0, "x", Some(0), 0, 2, None),
            span(0, 1, "y", None, 0, 3, None),
            span(0, 2, "z", Some(1), 3, 1, Some(T)),
            Event::Exact { stream: 0 },
        ]
    );
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
