//! Frame decoding never panics; a decoded frame re-describes without panic,
//! and its header agrees with the raw bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use parallelhue_core::{describe::frame_meaning, protocol};

fuzz_target!(|data: &[u8]| {
    match protocol::decode(data) {
        Ok(f) => {
            assert!(data.len() >= protocol::HEADER_LEN && data.len() <= protocol::MAX_FRAME_BYTES);
            assert_eq!(&data[..4], b"PHUE");
            assert_ne!(f.header.source_id, 0);
            let _ = frame_meaning(&f);
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
