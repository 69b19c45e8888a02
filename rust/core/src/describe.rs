//! The decoded meaning of a frame as JSON, in the shape of
//! `tests/vectors/*.json` (and of `parallelhue._native.decode_frame`).

use serde_json::{json, Map, Value};

use crate::protocol::{Body, Frame};

fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// `{"kind", "run_id", "source_id", "seq", "step", "timestamp_ns", "dropped",
/// "hello" | "records"}`.
pub fn frame_meaning(f: &Frame<'_>) -> Value {
    let h = &f.header;
    let mut m = Map::new();
    m.insert("kind".into(), json!(h.kind.name()));
    m.insert("run_id".into(), json!(hex(&h.run_id)));
    m.insert("source_id".into(), json!(h.source_id));
    m.insert("seq".into(), json!(h.seq));
    m.insert("step".into(), json!(h.step));
    m.insert("timestamp_ns".into(), json!(h.timestamp_ns));
    m.insert("dropped".into(), json!(h.dropped));
    match &f.body {
        Body::Hello(x) => {
            m.insert(
                "hello".into(),
                json!({
                    "role": x.role,
                    "engine": x.engine,
                    "role_derivation": x.role_derivation,
                    "async_scheduling": x.async_scheduling,
                    "num_speculative_tokens": x.num_speculative_tokens,
                    "verification": x.verification,
                    "plugin_version": x.plugin_version,
                    "engine_version": x.engine_version,
                    "spec_method": x.spec_method,
                }),
            );
        }
        Body::Provenance(recs) => {
            let v: Vec<Value> = recs
                .iter()
                .map(|r| {
                    json!({
                        "stream": r.stream,
                        "flags": r.flags,
                        "finish_reason": r.finish_reason,
                        "offset": r.offset,
                        "token_ids": r.token_ids().collect::<Vec<u32>>(),
                        "roles": r.roles,
                        "drafts_scheduled": r.drafts_scheduled,
                        "drafts_padded": r.drafts_padded,
                    })
                })
                .collect();
            m.insert("records".into(), Value::Array(v));
        }
        Body::Text(recs) => {
            let v: Vec<Value> = recs
                .iter()
                .map(|r| {
                    let tokens: Vec<Value> = r
                        .tokens()
                        .zip(r.fragment_slices())
                        .map(|(t, frag)| json!([t.token_id, hex(frag), t.span_back, t.lead_len]))
                        .collect();
                    json!({
                        "stream": r.stream,
                        "flags": r.flags,
                        "finish_reason": r.finish_reason,
                        "offset": r.offset,
                        "trimmed_tokens": r.trimmed_tokens,
                        "tokens": tokens,
                        "http_delta_hex": hex(r.http_delta.as_bytes()),
                    })
                })
                .collect();
            m.insert("records".into(), Value::Array(v));
        }
        Body::Notice(recs) => {
            let v: Vec<Value> = recs
                .iter()
                .map(|r| json!({"stream": r.stream, "code": r.code, "message": r.message}))
                .collect();
            m.insert("records".into(), Value::Array(v));
        }
    }
    Value::Object(m)
}
