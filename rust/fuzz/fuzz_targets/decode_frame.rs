//! Frame decoding never panics; a decoded frame re-describes without panic,
//! its header agrees with the raw bytes, and every fragment of a text record
//! is valid UTF-8 on its own (the decoder checks them in one pass).
#![no_main]
use libfuzzer_sys::fuzz_target;
use parallelhue_core::{describe::frame_meaning, protocol};

fuzz_target!(|data: &[u8]| {
    match protocol::decode(data) {
        Ok(f) => {
            assert!(data.len() >= protocol::HEADER_LEN && data.len() <= protocol::MAX_FRAME_BYTES);
            assert_eq!(&data[..4], b"PHUE");
            assert_ne!(f.header.source_id, 0);
            if let protocol::Body::Text(recs) = &f.body {
                for r in recs {
                    for frag in r.fragment_slices() {
                        assert!(std::str::from_utf8(frag).is_ok());
                    }
                }
            }
            let _ = frame_meaning(&f);
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
