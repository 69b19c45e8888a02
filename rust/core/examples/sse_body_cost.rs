//! CPU per SSE chunk of the reader's body pipeline (framing, SSE, JSON, fold).
//! `cargo run --release -p parallelhue-core --example sse_body_cost [PER_READ]`
//! PER_READ (default 1): HTTP chunks handed over per read; the client's
//! 10 ms rounds bring about three of the simulated engine's per read.
use parallelhue_core::http::Framing;
use parallelhue_core::http::StreamBody;
use parallelhue_core::sse::inputs::SseInputRef;
use std::time::Instant;

fn main() {
    let event = "data: {\"id\":\"chatcmpl-3f1c\",\"object\":\"chat.completion.chunk\",\"created\":1764400000,\"model\":\"sim\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\u{4e16}\u{754c} hello\"},\"logprobs\":null,\"finish_reason\":null,\"token_ids\":[1234,5678]}]}\n\n";
    let per_read: usize = std::env::args()
        .nth(1)
        .map_or(1, |a| a.parse().expect("PER_READ must be a number"));
    let chunk = format!("{:x}\r\n{event}\r\n", event.len()).repeat(per_read);
    let n = 200_000;
    let mut body = StreamBody::new(Framing::Chunked);
    let mut deltas = 0usize;
    // The HTTP thread copies each delta into its round buffers.
    let (mut text, mut ids) = (String::new(), Vec::<u32>::new());
    let start = Instant::now();
    for _ in 0..n / per_read {
        body.feed_ref(chunk.as_bytes(), &mut |i: SseInputRef<'_>| {
            if let SseInputRef::Delta { text: t, token_ids } = i {
                deltas += 1;
                text.push_str(t);
                ids.extend_from_slice(token_ids);
            }
        });
        if text.len() > 4096 {
            text.clear();
            ids.clear();
        }
    }
    let per = start.elapsed().as_secs_f64() / deltas as f64;
    println!(
        "{deltas} deltas, {:.2} us per chunk of {} bytes",
        per * 1e6,
        chunk.len() / per_read
    );
}
