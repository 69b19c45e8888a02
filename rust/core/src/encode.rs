//! A frame encoder, for tests, benchmarks and fuzz seeds (the production
//! encoder is the Python `parallelhue_vllm.wire`). It writes exactly the
//! layout of docs/PROTOCOL.md and checks nothing: tests use it to build
//! invalid frames too.

pub use crate::protocol::HelloFields;
use crate::protocol::{Kind, HEADER_LEN, MAGIC, PROTOCOL_VERSION};

/// A provenance record to encode.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProvRec {
    pub stream: u16,
    pub flags: u8,
    pub finish_reason: u8,
    pub offset: u32,
    pub drafts_scheduled: u16,
    pub drafts_padded: u16,
    pub token_ids: Vec<u32>,
    pub roles: Vec<u8>,
}

/// One token of a text record to encode: id, fragment bytes, span_back,
/// lead_len: with a fragment, the bytes from its span_back predecessors (0 without
/// span_back); with an empty fragment, its give count ([`crate::protocol::LEAD_UNKNOWN`]:
/// not known).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TextTok {
    pub token_id: u32,
    pub fragment: Vec<u8>,
    pub span_back: u8,
    pub lead_len: u16,
}

/// A text record to encode.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TextRec {
    pub stream: u16,
    pub flags: u8,
    pub finish_reason: u8,
    pub offset: u32,
    pub trimmed_tokens: u16,
    pub tokens: Vec<TextTok>,
    pub http: Vec<u8>,
}

/// A sending source: numbers its frames 0, 1, 2, ...
#[derive(Clone, Debug)]
pub struct Sender {
    pub run_id: [u8; 16],
    pub source_id: u64,
    pub next_seq: u64,
    pub timestamp_ns: u64,
    /// Put into the next frame's `dropped`, then reset.
    pub dropped: u32,
}

impl Sender {
    pub fn new(run_id: [u8; 16], source_id: u64) -> Self {
        Sender {
            run_id,
            source_id,
            next_seq: 0,
            timestamp_ns: 1_000_000,
            dropped: 0,
        }
    }

    /// Wrap a body in a header with the next sequence number.
    pub fn frame(&mut self, kind: Kind, step: u64, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::with_capacity(HEADER_LEN + body.len());
        v.extend_from_slice(&MAGIC);
        v.push(PROTOCOL_VERSION);
        v.push(kind as u8);
        v.extend_from_slice(&0u16.to_le_bytes());
        v.extend_from_slice(&self.run_id);
        v.extend_from_slice(&self.source_id.to_le_bytes());
        v.extend_from_slice(&self.next_seq.to_le_bytes());
        v.extend_from_slice(&step.to_le_bytes());
        v.extend_from_slice(&self.timestamp_ns.to_le_bytes());
        v.extend_from_slice(&self.dropped.to_le_bytes());
        v.extend_from_slice(&(body.len() as u32).to_le_bytes());
        v.extend_from_slice(body);
        self.next_seq += 1;
        self.timestamp_ns += 1_000;
        self.dropped = 0;
        v
    }

    pub fn hello(&mut self, h: &HelloFields) -> Vec<u8> {
        let body = hello_body(h);
        self.frame(Kind::Hello, 0, &body)
    }

    pub fn provenance(&mut self, step: u64, recs: &[ProvRec]) -> Vec<u8> {
        let body = provenance_body(recs);
        self.frame(Kind::Provenance, step, &body)
    }

    pub fn text(&mut self, step: u64, recs: &[TextRec]) -> Vec<u8> {
        let body = text_body(recs);
        self.frame(Kind::Text, step, &body)
    }

    pub fn notice(&mut self, step: u64, recs: &[(u16, u16, &str)]) -> Vec<u8> {
        let body = notice_body(recs);
        self.frame(Kind::Notice, step, &body)
    }
}

fn str8(v: &mut Vec<u8>, s: &str) {
    v.push(s.len() as u8);
    v.extend_from_slice(s.as_bytes());
}

pub fn hello_body(h: &HelloFields) -> Vec<u8> {
    let mut v = vec![
        h.role,
        h.engine,
        h.role_derivation,
        u8::from(h.async_scheduling),
    ];
    v.extend_from_slice(&h.num_speculative_tokens.to_le_bytes());
    v.extend_from_slice(&h.verification.to_le_bytes());
    str8(&mut v, &h.plugin_version);
    str8(&mut v, &h.engine_version);
    str8(&mut v, &h.spec_method);
    v
}

pub fn provenance_body(recs: &[ProvRec]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(recs.len() as u16).to_le_bytes());
    for r in recs {
        v.extend_from_slice(&r.stream.to_le_bytes());
        v.push(r.flags);
        v.push(r.finish_reason);
        v.extend_from_slice(&r.offset.to_le_bytes());
        v.extend_from_slice(&(r.token_ids.len() as u16).to_le_bytes());
        v.extend_from_slice(&r.drafts_scheduled.to_le_bytes());
        v.extend_from_slice(&r.drafts_padded.to_le_bytes());
        for id in &r.token_ids {
            v.extend_from_slice(&id.to_le_bytes());
        }
        v.extend_from_slice(&r.roles);
    }
    v
}

pub fn text_body(recs: &[TextRec]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(recs.len() as u16).to_le_bytes());
    for r in recs {
        v.extend_from_slice(&r.stream.to_le_bytes());
        v.push(r.flags);
        v.push(r.finish_reason);
        v.extend_from_slice(&r.offset.to_le_bytes());
        v.extend_from_slice(&(r.tokens.len() as u16).to_le_bytes());
        v.extend_from_slice(&r.trimmed_tokens.to_le_bytes());
        v.extend_from_slice(&(r.http.len() as u32).to_le_bytes());
        for t in &r.tokens {
            v.extend_from_slice(&t.token_id.to_le_bytes());
            v.extend_from_slice(&(t.fragment.len() as u16).to_le_bytes());
            v.push(t.span_back);
            v.extend_from_slice(&t.lead_len.to_le_bytes());
        }
        for t in &r.tokens {
            v.extend_from_slice(&t.fragment);
        }
        v.extend_from_slice(&r.http);
    }
    v
}

pub fn notice_body(recs: &[(u16, u16, &str)]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(recs.len() as u16).to_le_bytes());
    for (stream, code, msg) in recs {
        v.extend_from_slice(&stream.to_le_bytes());
        v.extend_from_slice(&code.to_le_bytes());
        v.extend_from_slice(&(msg.len() as u16).to_le_bytes());
        v.extend_from_slice(msg.as_bytes());
    }
    v
}
