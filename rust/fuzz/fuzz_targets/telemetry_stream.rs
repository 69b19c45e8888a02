//! The HTTP telemetry stream decoder never panics, never buffers more than
//! one item, and gives the same items and the same error however the bytes
//! were split. The first byte picks the split size and whether a valid
//! preamble goes first (so the fuzzer spends its time on items).
#![no_main]
use libfuzzer_sys::fuzz_target;
use parallelhue_core::telemetry::stream::{
    StreamDecoder, StreamItem, ITEM_HEADER_LEN, MAX_FRAME_ITEM, PREAMBLE_LEN,
};

fn decode(parts: &[&[u8]]) -> (Vec<StreamItem>, Option<String>, u64) {
    let mut decoder = StreamDecoder::new();
    let mut items = Vec::new();
    for part in parts {
        let before = decoder.position();
        let result = decoder.push(part, &mut items);
        assert!(decoder.position() >= before);
        assert!(decoder.buffered() <= PREAMBLE_LEN.max(ITEM_HEADER_LEN + MAX_FRAME_ITEM));
        if let Err(e) = result {
            return (items, Some(e.to_string()), decoder.position());
        }
    }
    let error = decoder.finish().err().map(|e| e.to_string());
    (items, error, decoder.position())
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, raw)) = data.split_first() else {
        return;
    };
    let mut stream = Vec::with_capacity(raw.len() + PREAMBLE_LEN);
    if seed & 0x80 != 0 {
        stream.extend_from_slice(b"PHTS\x01\x00\x00\x00");
        stream.extend_from_slice(&[0x5a; 16]);
        stream.extend_from_slice(&[0; 8]);
    }
    stream.extend_from_slice(raw);
    let step = usize::from(seed & 0x7f) + 1;
    let whole = decode(&[&stream]);
    let parts: Vec<&[u8]> = stream.chunks(step).collect();
    let split = decode(&parts);
    assert_eq!(whole, split, "the result depends on how the bytes were split");
    // A clean end is an end item, and nothing follows it.
    if whole.1.is_none() {
        assert!(matches!(whole.0.last(), Some(StreamItem::End { .. })));
        assert_eq!(whole.2 as usize, stream.len());
    }
});
