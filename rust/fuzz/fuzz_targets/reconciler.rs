//! The reconciler fed arbitrary frames and SSE inputs never panics; a stream
//! gets at most two verdict events (an exact one revoked by a failure), no
//! span after its failure, and after finalize() every stream has a verdict
//! that nothing changes any more.
#![no_main]
use libfuzzer_sys::fuzz_target;
use parallelhue_core::reconcile::{Event, Reconciler, Verdict, LATE_MESSAGE};

const RUN: [u8; 16] = [0x5f; 16];
const REASONS: [Option<&str>; 4] = [Some("stop"), Some("length"), None, Some("abort")];

/// What the events said about one stream so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
enum Seen {
    #[default]
    Pending,
    Exact,
    Failed,
}

fn check(events: Vec<Event>, seen: &mut [Seen; 3], finalized: bool) {
    for e in events {
        match e {
            Event::Exact { stream } => {
                let s = &mut seen[usize::from(stream)];
                assert!(
                    !finalized && *s == Seen::Pending,
                    "exact twice or after a failure"
                );
                *s = Seen::Exact;
            }
            Event::Failed { stream, .. } => {
                let s = &mut seen[usize::from(stream)];
                assert_ne!(*s, Seen::Failed, "two failures");
                *s = Seen::Failed;
            }
            Event::Span { stream, .. } => {
                assert_eq!(
                    seen[usize::from(stream)],
                    Seen::Pending,
                    "span after a verdict"
                );
            }
            Event::Run { message } => {
                if finalized {
                    assert_eq!(message, LATE_MESSAGE);
                }
            }
        }
    }
}

// Input: a sequence of operations. Op byte: 0 frame (u16 len + bytes, the run
// id and the protocol version patched in so frames are admitted), 1 SSE delta (stream, n
// ids, ids as u8, text bytes as lossy UTF-8), 2 finish SSE (stream, reason),
// 3 chunk id (stream, right or wrong), 4 another choice, 5 usage (stream,
// completion tokens, per-step lists).
fuzz_target!(|data: &[u8]| {
    let mut r = Reconciler::with_run_id(RUN, 3);
    let mut seen = [Seen::Pending; 3];
    let mut i = 0usize;
    let byte = |i: usize| data.get(i).copied().unwrap_or(0);
    while i < data.len() {
        let op = data[i] % 6;
        i += 1;
        let s = u16::from(byte(i) % 3);
        match op {
            0 => {
                if i + 2 > data.len() {
                    break;
                }
                let n = usize::from(u16::from_le_bytes([data[i], data[i + 1]])) % 600;
                i += 2;
                let end = (i + n).min(data.len());
                let mut f = data[i..end].to_vec();
                i = end;
                if f.len() >= 24 {
                    f[8..24].copy_from_slice(&RUN);
                }
                if f.len() >= 64 {
                    let body = (f.len() - 64) as u32;
                    f[60..64].copy_from_slice(&body.to_le_bytes());
                    f[0..4].copy_from_slice(b"PHUE");
                    f[4] = parallelhue_core::protocol::PROTOCOL_VERSION;
                    f[6] = 0;
                    f[7] = 0;
                }
                r.push_frame(&f);
            }
            1 => {
                let n = usize::from(byte(i + 1) % 8);
                i += 2;
                let end = (i + n).min(data.len());
                let ids: Vec<u32> = data[i.min(end)..end]
                    .iter()
                    .map(|&b| u32::from(b % 8))
                    .collect();
                i = end;
                let tn = usize::from(byte(i) % 8);
                i += 1;
                let tend = (i + tn).min(data.len());
                let text = String::from_utf8_lossy(&data[i.min(tend)..tend]).into_owned();
                i = tend;
                r.push_sse(s, &text, &ids);
            }
            2 => {
                r.finish_sse(s, REASONS[usize::from(byte(i + 1) % 4)]);
                i += 2;
            }
            3 => {
                let id = if byte(i + 1) % 2 == 0 {
                    format!("chatcmpl-ph1_{}_{s}", "5f".repeat(16))
                } else {
                    "chatcmpl-x".to_owned()
                };
                r.push_sse_id(s, &id);
                i += 2;
            }
            4 => {
                r.push_sse_choice(s, u32::from(byte(i + 1)));
                i += 2;
            }
            _ => {
                let lists: Vec<u32> = (0..usize::from(byte(i + 2) % 4))
                    .map(|j| u32::from(byte(i + 3 + j) % 5))
                    .collect();
                let accepted = (byte(i + 1) & 1 != 0).then_some(lists.as_slice());
                let drafted = (byte(i + 1) & 2 != 0).then_some(lists.as_slice());
                r.push_sse_usage(s, Some(u64::from(byte(i + 1) >> 2)), accepted, drafted);
                i += 3 + lists.len();
            }
        }
        check(r.drain(), &mut seen, false);
    }
    r.finalize();
    check(r.drain(), &mut seen, false);
    let verdicts: Vec<Verdict> = (0..3).map(|s| r.verdict(s)).collect();
    assert!(verdicts.iter().all(|v| *v != Verdict::Pending));
    // Nothing changes after finalize().
    r.push_frame(data);
    r.push_sse(0, "x", &[1]);
    r.finish_sse(1, Some("stop"));
    check(r.drain(), &mut seen, true);
    assert_eq!((0..3).map(|s| r.verdict(s)).collect::<Vec<_>>(), verdicts);
});
