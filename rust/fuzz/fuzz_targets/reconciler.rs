//! The reconciler fed arbitrary frames and SSE deltas never panics, gives
//! each stream at most one verdict, and after finalize() every stream has one.
#![no_main]
use libfuzzer_sys::fuzz_target;
use parallelhue_core::reconcile::{Event, Reconciler, Verdict};

const RUN: [u8; 16] = [0x5f; 16];

// Input: a sequence of operations. Op byte: 0 frame (u16 len + bytes, the run
// id patched in so frames are admitted), 1 SSE delta (stream, n ids, ids as
// u8, text bytes as lossy UTF-8), 2 finish SSE.
fuzz_target!(|data: &[u8]| {
    let mut r = Reconciler::with_run_id(RUN, 3);
    let mut verdicts = [0u32; 3];
    let mut i = 0usize;
    while i < data.len() {
        let op = data[i] % 3;
        i += 1;
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
                    f[0..5].copy_from_slice(b"PHUE\x02");
                    f[6] = 0;
                    f[7] = 0;
                }
                r.push_frame(&f);
            }
            1 => {
                if i + 2 > data.len() {
                    break;
                }
                let s = u16::from(data[i] % 3);
                let n = usize::from(data[i + 1] % 8);
                i += 2;
                let end = (i + n).min(data.len());
                let ids: Vec<u32> = data[i..end].iter().map(|&b| u32::from(b % 8)).collect();
                i = end;
                let tn = usize::from(data.get(i).copied().unwrap_or(0) % 8);
                i += 1;
                let tend = (i + tn).min(data.len());
                let text = String::from_utf8_lossy(&data[i.min(tend)..tend]).into_owned();
                i = tend;
                r.push_sse(s, &text, &ids);
            }
            _ => {
                if i >= data.len() {
                    break;
                }
                r.finish_sse(u16::from(data[i] % 3));
                i += 1;
            }
        }
        for e in r.drain() {
            match e {
                Event::Exact { stream } | Event::Failed { stream, .. } => {
                    verdicts[usize::from(stream)] += 1;
                    assert_eq!(verdicts[usize::from(stream)], 1, "two verdicts");
                }
                Event::Span { stream, .. } => assert_eq!(verdicts[usize::from(stream)], 0),
                Event::Run { .. } => {}
            }
        }
    }
    r.finalize();
    for e in r.drain() {
        if let Event::Exact { stream } | Event::Failed { stream, .. } = e {
            verdicts[usize::from(stream)] += 1;
        }
    }
    for (s, v) in verdicts.iter().enumerate() {
        assert_eq!(*v, 1);
        assert_ne!(r.verdict(s as u16), Verdict::Pending);
    }
});
