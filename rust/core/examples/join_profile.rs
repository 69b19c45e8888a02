//! Profile helper: run the benchmark join N times (`cargo run --release --example join_profile`).
use parallelhue_core::reconcile::Reconciler;
use parallelhue_core::workload::{feed_inputs, generate, WorkloadConfig};

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(20);
    let wl = generate(&WorkloadConfig {
        streams: 64,
        tokens_per_stream: 2_000,
        k: 5,
        coalesce: 1,
        seed: 42,
    });
    let t = std::time::Instant::now();
    for _ in 0..n {
        let mut r = Reconciler::with_run_id(wl.run_id, 64);
        for chunk in wl.inputs.chunks(64) {
            feed_inputs(chunk, &mut r);
            std::hint::black_box(r.drain());
        }
    }
    let dt = t.elapsed().as_secs_f64();
    println!(
        "{:.2} M tokens/s",
        (wl.total_tokens as f64 * n as f64) / dt / 1e6
    );
}
