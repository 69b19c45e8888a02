//! CPU per SSE chunk of the reader's body pipeline (framing, SSE, JSON, fold).
//! `cargo run --release -p parallelhue-core --example sse_body_cost`
use parallelhue_core::http::Framing;
use parallelhue_core::sse_inputs::SseInput;
use parallelhue_core::sse_stream::StreamBody;
use std::time::Instant;

fn main() {
    let event = "data: {\"id\":\"chatcmpl-3f1c\",\"object\":\"chat.completion.chunk\",\"created\":1764400000,\"model\":\"sim\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\u{4e16}\u{754c} hello\"},\"logprobs\":null,\"finish_reason\":null,\"token_ids\":[1234,5678]}]}\n\n";
    let chunk = format!("{:x}\r\n{event}\r\n", event.len());
    let n = 200_000;
    let mut body = StreamBody::new(Framing::Chunked);
    let mut deltas = 0usize;
    let start = Instant::now();
    for _ in 0..n {
        body.feed(chunk.as_bytes(), &mut |i: SseInput| {
            deltas += usize::from(matches!(i, SseInput::Delta { .. }))
        });
    }
    let per = start.elapsed().as_secs_f64() / n as f64;
    println!(
        "{deltas} deltas, {:.2} us per chunk of {} bytes",
        per * 1e6,
        chunk.len()
    );
}
