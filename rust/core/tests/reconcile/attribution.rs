//! Per-character attribution: lead_len, give counts across records, unknown
//! gives.

use super::*;

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
