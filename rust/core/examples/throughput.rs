//! Single-core throughput on the benchmark workload, timed both by the wall
//! clock and by this thread's CPU clock (the latter is robust to other jobs
//! sharing the machine). `cargo run --release -p parallelhue-core --example throughput [rounds]`
use std::time::Instant;

use parallelhue_core::protocol::decode;
use parallelhue_core::reconcile::Reconciler;
use parallelhue_core::workload::{feed_inputs, generate, Workload, WorkloadConfig};

fn cpu_now() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn measure(name: &str, tokens: u64, rounds: usize, mut f: impl FnMut()) {
    f(); // warm up
    let (w0, c0) = (Instant::now(), cpu_now());
    for _ in 0..rounds {
        f();
    }
    let (wall, cpu) = (w0.elapsed().as_secs_f64(), cpu_now() - c0);
    let total = tokens as f64 * rounds as f64;
    println!(
        "{name:<40} {:>7.2} M tokens/s wall  {:>7.2} M tokens/s CPU  ({:.2} ms CPU per round)",
        total / wall / 1e6,
        total / cpu / 1e6,
        cpu / rounds as f64 * 1e3
    );
}

fn join(wl: &Workload) {
    let mut r = Reconciler::with_run_id(wl.run_id, 64);
    let mut events = Vec::new();
    for chunk in wl.inputs.chunks(64) {
        feed_inputs(chunk, &mut r);
        r.drain_into(&mut events);
        std::hint::black_box(&events);
        events.clear();
    }
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let cfg = |coalesce| WorkloadConfig {
        streams: 64,
        tokens_per_stream: 2_000,
        k: 5,
        coalesce,
        seed: 42,
    };
    let per_step = generate(&cfg(1));
    let coalesced = generate(&cfg(4));
    let tokens = per_step.total_tokens;
    let frames = per_step.frames();
    println!(
        "workload: 64 streams x 2000 tokens = {tokens} tokens, {} frames, {} SSE chunks per step / {} coalesced",
        frames.len(),
        per_step.inputs.len() - frames.len() - 64,
        coalesced.inputs.len() - frames.len() - 64,
    );
    measure("decode (P+T frames; per token)", tokens, rounds * 4, || {
        for f in &frames {
            std::hint::black_box(decode(f).is_ok());
        }
    });
    measure("join, one SSE chunk per step", tokens, rounds, || {
        join(&per_step)
    });
    measure("join, 4 steps per SSE chunk", tokens, rounds, || {
        join(&coalesced)
    });
}
