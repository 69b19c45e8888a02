//! The fast chunk paths (the byte scanner, then the typed serde path) read
//! every chunk exactly as the `Value` path does: the same chunk, or the
//! `Value` path's error (`parse_chunk` never makes up an error of its own).
#![no_main]
use libfuzzer_sys::fuzz_target;
use parallelhue_core::sse::{parse_chunk, parse_chunk_value};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    assert_eq!(
        parse_chunk(text),
        parse_chunk_value(text),
        "the fast paths read {text:?} differently"
    );
});
