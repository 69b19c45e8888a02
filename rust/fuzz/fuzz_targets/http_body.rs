//! A stream's body (HTTP framing, then SSE, then the chunk fold) never
//! panics, whatever the bytes, and what it yields does not depend on how the
//! network split them: the first byte picks the framing and the split size.
#![no_main]
use libfuzzer_sys::fuzz_target;
use parallelhue_core::http::Framing;
use parallelhue_core::sse::inputs::SseInput;
use parallelhue_core::http::StreamBody;

fn read(framing: Framing, parts: &[&[u8]]) -> (Vec<SseInput>, String) {
    let mut body = StreamBody::new(framing);
    let mut deltas = Vec::new();
    let mut on_delta = |i: SseInput| deltas.push(i);
    for part in parts {
        body.feed(part, &mut on_delta);
    }
    body.finish(&mut on_delta);
    let end = format!("{:?} {:?} {:?}", body.end, body.finish_reason, body.usage);
    (deltas, end)
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, raw)) = data.split_first() else {
        return;
    };
    let framing = match seed % 3 {
        0 => Framing::Chunked,
        1 => Framing::Length(u64::from(seed) * 7),
        _ => Framing::Close,
    };
    let step = usize::from(seed / 3 % 23) + 1;
    let whole = read(framing, &[raw]);
    let parts: Vec<&[u8]> = raw.chunks(step).collect();
    let split = read(framing, &parts);
    assert_eq!(
        whole, split,
        "the result depends on how the bytes were split"
    );
});
