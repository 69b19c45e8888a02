//! `Fed`'s unit tests: `take()`'s batches, in events and in packed mode.

use super::take::pack_spans;
use super::*;
use crate::outcome::EndKind;
use crate::spans::{span_word, unpack_spans, SPAN_RECORD_BYTES};

/// Records grouped by stream in stream order, an uncolored gap record
/// (its end where the next span starts, no step or role) before a span
/// that starts beyond its stream's last end, spans of unknown streams
/// left out, and the ends carried over to the next take.
#[test]
fn pack_spans_groups_by_stream_with_gap_records() {
    let mut shown = Shown {
        span_end: vec![0; 3],
        span_runs: vec![Vec::new(); 3],
        ..Shown::default()
    };
    let w = |step, role| span_word(Some(step), Some(role));
    let mut batch = Batch::default();
    let spans = [
        (2, 0, 3, w(0, 1)),
        (0, 0, 2, w(0, 0)),
        (2, 3, 5, w(1, 1)),
        (0, 4, 6, w(1, 2)),
        (7, 0, 1, w(0, 0)),
    ];
    pack_spans(&mut shown, &mut batch, spans.into_iter());
    assert_eq!(batch.span_index, vec![(0, 0, 48), (2, 48, 80)]);
    assert_eq!(
        unpack_spans(&batch.spans[..48]),
        vec![
            (2, Some(0), Some(0)),
            (4, None, None),
            (6, Some(1), Some(2))
        ]
    );
    assert_eq!(
        unpack_spans(&batch.spans[48..]),
        vec![(3, Some(0), Some(1)), (5, Some(1), Some(1))]
    );
    let mut batch = Batch::default();
    let spans = [(0, 6, 7, w(2, 3)), (1, 2, 4, w(0, 0))];
    pack_spans(&mut shown, &mut batch, spans.into_iter());
    assert_eq!(batch.span_index, vec![(0, 0, 16), (1, 16, 48)]);
    assert_eq!(
        unpack_spans(&batch.spans[..16]),
        vec![(7, Some(2), Some(3))]
    );
    assert_eq!(
        unpack_spans(&batch.spans[16..]),
        vec![(2, None, None), (4, Some(0), Some(0))]
    );
    let mut batch = Batch::default();
    pack_spans(&mut shown, &mut batch, std::iter::empty());
    assert!(batch.spans.is_empty() && batch.span_index.is_empty());
}

#[test]
fn take_gives_text_once_spans_as_ranges_and_ends() {
    let mut fed = Fed::new(Reconciler::with_run_id([1; 16], 3));
    fed.stream_started(2, 1.0);
    fed.sse_delta(2, "h\u{e9}", &[5, 6], 1.5);
    fed.sse_delta(2, "", &[7], 1.6);
    fed.sse_delta(2, "!", &[8], 1.7);
    fed.stream_ended(Ended {
        stream: 2,
        outcome: Outcome::finished(),
        finish_reason: Some("stop".into()),
        usage: None,
        at: 1.8,
    });
    fed.stream_ended(Ended {
        stream: 0,
        outcome: Outcome::http(EndKind::HttpStatus, 500, "boom"),
        finish_reason: None,
        usage: None,
        at: 1.9,
    });
    let batch = fed.take();
    assert_eq!(
        batch.texts,
        vec![(
            2,
            StreamText {
                utf8: "h\u{e9}!".as_bytes().to_vec(),
                chunk_ends: vec![3, 4],
                times: vec![1.5, 1.6, 1.7],
                tokens: 4,
                delta_ends: vec![3, 3, 4],
                delta_tokens: vec![2, 1, 1],
                ..StreamText::default()
            }
        )]
    );
    assert_eq!(batch.ends.len(), 2);
    assert!(batch.spans.is_empty() && batch.span_index.is_empty()); // nothing proven
    let again = fed.take();
    assert!(again.texts.is_empty() && again.ends.is_empty());
    // The next delta's chunk end continues the stream's byte count.
    fed.sse_delta(2, "ab", &[9], 2.0);
    assert_eq!(fed.take().texts[0].1.chunk_ends, vec![6]);
}

/// The server-reported tier's inputs reach the screen in order with the
/// stream's delta count at each counts input; the reconciler never sees
/// the counts (its stream stays without evidence of them).
#[test]
fn take_gives_the_server_reported_inputs() {
    let mut fed = Fed::new(Reconciler::with_run_id([1; 16], 2));
    let timings = |n| SseInput::Counts {
        kind: CountsKind::Timings,
        values: [Some(n), Some(3), None],
    };
    fed.sse_input(1, &timings(1), 1.0);
    fed.sse_delta(1, "ab", &[], 1.1);
    fed.sse_input(1, &timings(2), 1.1);
    let usage = SseInput::Usage {
        completion_tokens: Some(2),
        per_step_accepted: Some(vec![1]),
        per_step_drafted: None,
    };
    fed.sse_input(1, &usage, 1.2);
    // A stream the run does not have is ignored.
    fed.sse_input(9, &timings(1), 1.3);
    let batch = fed.take();
    assert_eq!(batch.texts.len(), 1);
    let (stream, text) = &batch.texts[0];
    assert_eq!(*stream, 1);
    assert_eq!(text.delta_ends, vec![2]);
    assert_eq!(text.delta_tokens, vec![0]);
    assert_eq!(text.counts, vec![0, 1, 1, 3, -1, 1, 1, 2, 3, -1]);
    assert_eq!(text.lists, vec![(Some(vec![1]), None)]);
}

/// The packed spans of every take, stream by stream, are the span events
/// of the same inputs drained from a plain reconciler: ends and
/// step/role words in order, for every batch size.
#[test]
fn take_packs_exactly_the_drained_spans() {
    use crate::workload::{generate, WorkloadConfig};
    for (coalesce, per_take) in [(1, 1), (1, 37), (2, 256), (1, usize::MAX)] {
        let w = generate(&WorkloadConfig {
            streams: 8,
            tokens_per_stream: 300,
            coalesce,
            seed: 7,
            ..WorkloadConfig::default()
        });
        let mut plain = Reconciler::with_run_id(w.run_id, 8);
        crate::workload::feed_inputs(&w.inputs, &mut plain);
        let mut expected = vec![Vec::new(); 8];
        for e in plain.drain() {
            if let Event::Span {
                stream,
                byte_start,
                text,
                step,
                role,
                ..
            } = e
            {
                let end = byte_start + text.len() as u64;
                expected[stream as usize].push((end, step, role));
            }
        }
        let mut fed = Fed::new(Reconciler::with_run_id(w.run_id, 8));
        let mut got = vec![Vec::new(); 8];
        let mut collect = |fed: &mut Fed| {
            let batch = fed.take();
            let mut at = 0;
            for &(s, start, end) in &batch.span_index {
                assert_eq!(start, at, "streams' records tile the buffer");
                at = end;
                got[s as usize].extend(unpack_spans(&batch.spans[start..end]));
            }
            assert_eq!(at, batch.spans.len());
        };
        for (i, input) in w.inputs.iter().enumerate() {
            feed_one(&mut fed, input);
            if (i + 1) % per_take.min(w.inputs.len()) == 0 {
                collect(&mut fed);
            }
        }
        collect(&mut fed);
        assert!(expected.iter().all(|spans| !spans.is_empty()));
        assert_eq!(
            got, expected,
            "coalesce {coalesce}, {per_take} inputs per take"
        );
    }
}

fn feed_one(fed: &mut Fed, input: &crate::workload::Input) {
    use crate::workload::Input;
    match input {
        Input::Frame(f) => fed.push_frame(f),
        Input::Sse {
            stream,
            text,
            token_ids,
        } => fed.push_sse(*stream, text, token_ids),
        Input::SseId { stream, id } => fed.push_sse_id(*stream, id),
        Input::FinishSse { stream, reason } => fed.finish_sse(*stream, reason.as_deref()),
    }
}

/// Packed mode changes how spans are built, not which: every take of
/// the same inputs gives the same packed spans, span index and other
/// events (in order) as events mode, for clean runs and for runs where
/// lying SSE text, dropped frames and early finishes put failures and
/// verdicts between spans of one input (the merge rule's edge), at every
/// batch size; and `drain()` in packed mode gives those other events
/// without any span.
#[test]
fn packed_mode_gives_the_spans_of_events_mode() {
    use crate::workload::{generate, Input, WorkloadConfig};
    let mut checked_spans = 0;
    let mut checked_failed = 0;
    for (coalesce, per_take, lie) in [
        (1, 1, 0),
        (1, 37, 0),
        (2, 256, 0),
        (1, usize::MAX, 0),
        (1, 5, 7),
        (3, 64, 11),
        (1, usize::MAX, 13),
    ] {
        for split in [false, true] {
            let w = generate(&WorkloadConfig {
                streams: 8,
                tokens_per_stream: 300,
                coalesce,
                seed: 11,
                ..WorkloadConfig::default()
            });
            let mut inputs = w.inputs.clone();
            if split {
                // Each delta as two, cut at the middle character: a step's
                // spans come from two inputs (they must not merge).
                inputs = crate::workload::split_deltas(inputs);
            }
            if lie > 0 {
                let mut n = 0;
                let lost_after = inputs.len() * 3 / 4;
                inputs.retain_mut(|input| {
                    n += 1;
                    match input {
                        // A lying SSE delta: one more character.
                        Input::Sse { text, .. } if n % (lie * 3) == 0 => text.push('x'),
                        // A lost frame, late in the run.
                        Input::Frame(_) if n > lost_after && n % (lie * 5) == 1 => return false,
                        _ => {}
                    }
                    true
                });
                // A stream whose SSE ends early.
                inputs.insert(
                    inputs.len() / 2,
                    Input::FinishSse {
                        stream: 3,
                        reason: Some("stop".into()),
                    },
                );
            }
            let mut plain = Fed::new(Reconciler::with_run_id(w.run_id, 8));
            let mut packed = Fed::new_packed(Reconciler::with_run_id(w.run_id, 8));
            assert!(packed.packs_spans() && !plain.packs_spans());
            let per_take = per_take.min(inputs.len());
            let mut compare = |plain: &mut Fed, packed: &mut Fed| {
                let (a, b) = (plain.take(), packed.take());
                assert_eq!(a.spans, b.spans, "coalesce {coalesce}, per take {per_take}");
                assert_eq!(a.span_index, b.span_index);
                assert_eq!(a.events, b.events);
                assert!(a.events.iter().all(|e| !matches!(e, Event::Span { .. })));
                checked_spans += a.spans.len() / SPAN_RECORD_BYTES;
                checked_failed += a
                    .events
                    .iter()
                    .filter(|e| matches!(e, Event::Failed { .. }))
                    .count();
            };
            for (i, input) in inputs.iter().enumerate() {
                feed_one(&mut plain, input);
                feed_one(&mut packed, input);
                if (i + 1) % per_take == 0 {
                    compare(&mut plain, &mut packed);
                }
            }
            plain.finalize();
            packed.finalize();
            compare(&mut plain, &mut packed);
            // drain() in packed mode: the other events, no span.
            let mut plain = Reconciler::with_run_id(w.run_id, 8);
            let mut packed = Reconciler::with_run_id(w.run_id, 8);
            packed.pack_spans();
            for input in &inputs {
                crate::workload::feed_inputs(std::slice::from_ref(input), &mut plain);
                crate::workload::feed_inputs(std::slice::from_ref(input), &mut packed);
            }
            let others: Vec<Event> = plain
                .drain()
                .into_iter()
                .filter(|e| !matches!(e, Event::Span { .. }))
                .collect();
            assert_eq!(packed.drain(), others);
        }
    }
    // The lies made failures, and spans were compared.
    assert!(
        checked_spans > 1_000 && checked_failed >= 8,
        "{checked_spans} spans, {checked_failed} failures"
    );
}
