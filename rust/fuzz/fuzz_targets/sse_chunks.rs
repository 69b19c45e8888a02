//! SSE handling never panics, whatever the bytes and wherever they are split:
//! the first byte chooses split points, the events must not depend on them.
#![no_main]
use libfuzzer_sys::fuzz_target;
use parallelhue_core::sse::SseParser;

fuzz_target!(|data: &[u8]| {
    let Some((&seed, body)) = data.split_first() else {
        return;
    };
    let mut whole = SseParser::new();
    let mut a = whole.feed(body);
    a.extend(whole.finish());
    let mut split = SseParser::new();
    let mut b = Vec::new();
    let step = usize::from(seed % 17) + 1;
    for part in body.chunks(step) {
        b.extend(split.feed(part));
    }
    b.extend(split.finish());
    assert_eq!(a, b, "events depend on how the bytes were split");
});
