//! `cargo bench -p parallelhue-core`: frame decoding and the three-witness join
//! on the workload: 64 streams x 2,000 tokens, steps of 1-6 tokens
//! (K = 5), ASCII/accented/CJK/emoji text cut into 1-3 byte tokens (so
//! characters split across tokens and steps), one SSE chunk per step or four
//! steps coalesced into one chunk.
//!
//! Timed with this thread's CPU clock (not the wall clock), so other jobs on
//! a shared machine disturb the numbers far less: it is single-core throughput.

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use parallelhue_core::protocol::decode;
use parallelhue_core::reconcile::{Event, Reconciler};
use parallelhue_core::workload::{feed_inputs, generate, Workload, WorkloadConfig};

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`).
struct CpuTime(WallTime);

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

impl Measurement for CpuTime {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        thread_cpu()
    }
    fn end(&self, start: Duration) -> Duration {
        thread_cpu().saturating_sub(start)
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, v: &Duration) -> f64 {
        v.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        self.0.formatter()
    }
}

fn workload(coalesce: u32) -> Workload {
    generate(&WorkloadConfig {
        streams: 64,
        tokens_per_stream: 2_000,
        k: 5,
        coalesce,
        seed: 42,
    })
}

/// Feed everything, draining events as a client would (every 64 inputs).
fn join(wl: &Workload) -> usize {
    let mut r = Reconciler::with_run_id(wl.run_id, 64);
    let mut exact = 0;
    let mut events = Vec::new();
    for chunk in wl.inputs.chunks(64) {
        feed_inputs(chunk, &mut r);
        r.drain_into(&mut events);
        for e in events.drain(..) {
            if let Event::Exact { .. } = e {
                exact += 1;
            }
        }
    }
    assert_eq!(exact, 64);
    exact
}

fn bench(c: &mut Criterion<CpuTime>) {
    let per_step = workload(1);
    let coalesced = workload(4);
    let tokens = per_step.total_tokens;

    let frames = per_step.frames();
    let frame_bytes: usize = frames.iter().map(|f| f.len()).sum();
    let mut g = c.benchmark_group("decode");
    g.measurement_time(Duration::from_secs(5));
    // Every token appears twice in the frames: once in provenance, once in text.
    g.throughput(Throughput::Elements(2 * tokens));
    g.bench_function(
        format!(
            "{} frames, {} bytes (elements = P+T tokens)",
            frames.len(),
            frame_bytes
        ),
        |b| {
            b.iter(|| {
                let mut n = 0usize;
                for f in &frames {
                    n += usize::from(decode(black_box(f)).is_ok());
                }
                assert_eq!(n, frames.len());
            })
        },
    );
    g.finish();

    let mut g = c.benchmark_group("join");
    g.measurement_time(Duration::from_secs(8));
    g.sample_size(30);
    g.throughput(Throughput::Elements(tokens));
    for (name, wl) in [
        ("one SSE chunk per step", &per_step),
        ("4 steps per SSE chunk", &coalesced),
    ] {
        g.bench_function(format!("64x2000 tokens, {name}"), |b| {
            b.iter_batched(|| (), |_| black_box(join(wl)), BatchSize::SmallInput)
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(CpuTime(WallTime));
    targets = bench
}
criterion_main!(benches);
