//! Reconciler behaviour (docs/PROTOCOL.md "Reconciliation"), edge cases first.

use parallelhue_core::encode::{HelloFields, ProvRec, Sender, TextRec, TextTok};
use parallelhue_core::protocol::LEAD_UNKNOWN;
use parallelhue_core::reconcile::{Event, Reconciler, Verdict, ROLE_FRONTEND, ROLE_SCHEDULER};
use parallelhue_core::workload::{feed_inputs, generate, WorkloadConfig};

const RUN: &str = "00112233445566778899aabbccddeeff";
const A: u8 = 1; // accepted
const T: u8 = 2; // target
const B: u8 = 3; // bonus
const P: u8 = 0; // plain

/// Builds the frames of one run and feeds them. Each frame gets the next
/// step of its sender (one record per stream and step); the first SSE delta
/// of a stream is preceded by its chunk id, as the SSE readers push it.
struct Run {
    r: Reconciler,
    sched: Sender,
    front: Sender,
    step: u64,
    t_step: u64,
    ids_sent: Vec<bool>,
}

/// The SSE chunk id vLLM gives stream `s` of the run.
fn chunk_id(s: u16) -> String {
    format!("chatcmpl-ph1_{RUN}_{s}")
}

fn run_id() -> [u8; 16] {
    parallelhue_core::reconcile::parse_run_id(RUN).unwrap()
}

impl Run {
    fn new(streams: u32) -> Run {
        let mut run = Run {
            r: Reconciler::new(RUN, streams).unwrap(),
            sched: Sender::new(run_id(), 0xaaaa),
            front: Sender::new(run_id(), 0xbbbb),
            step: 1,
            t_step: 1,
            ids_sent: vec![false; streams as usize],
        };
        let h = run.sched.hello(&HelloFields::simulated(ROLE_SCHEDULER, 3));
        run.r.push_frame(&h);
        let h = run.front.hello(&HelloFields::simulated(ROLE_FRONTEND, 3));
        run.r.push_frame(&h);
        run
    }

    /// Provenance for one stream: (offset, ids, roles, drafts_scheduled, flags).
    fn prov(&mut self, stream: u16, offset: u32, ids: &[u32], roles: &[u8], ds: u16, flags: u8) {
        let rec = ProvRec {
            stream,
            flags,
            finish_reason: if flags & 1 != 0 { 1 } else { 0 },
            offset,
            drafts_scheduled: ds,
            drafts_padded: 0,
            token_ids: ids.to_vec(),
            roles: roles.to_vec(),
        };
        let f = self.sched.provenance(self.step, &[rec]);
        self.step += 1;
        self.r.push_frame(&f);
    }

    /// Text for one stream: tokens (id, fragment, span_back), http delta, flags.
    fn text(&mut self, stream: u16, offset: u32, toks: &[(u32, &str, u8)], http: &str, flags: u8) {
        self.text_raw(stream, offset, toks, http.as_bytes(), flags, 0)
    }

    fn text_raw(
        &mut self,
        stream: u16,
        offset: u32,
        toks: &[(u32, &str, u8)],
        http: &[u8],
        flags: u8,
        trimmed: u16,
    ) {
        let rec = TextRec {
            stream,
            flags,
            finish_reason: if flags & 1 != 0 { 1 } else { 0 },
            offset,
            trimmed_tokens: trimmed,
            tokens: toks
                .iter()
                .map(|(id, frag, back)| TextTok {
                    token_id: *id,
                    fragment: frag.as_bytes().to_vec(),
                    span_back: *back,
                    lead_len: if *back == 0 { 0 } else { LEAD_UNKNOWN },
                })
                .collect(),
            http: http.to_vec(),
        };
        let f = self.front.text(self.t_step, &[rec]);
        self.t_step += 1;
        self.r.push_frame(&f);
    }

    fn sse(&mut self, stream: u16, text: &str, ids: &[u32]) {
        if !std::mem::replace(&mut self.ids_sent[stream as usize], true) {
            self.r.push_sse_id(stream, &chunk_id(stream));
        }
        self.r.push_sse(stream, text, ids);
    }

    fn finish(&mut self, stream: u16, reason: &str) {
        if !std::mem::replace(&mut self.ids_sent[stream as usize], true) {
            self.r.push_sse_id(stream, &chunk_id(stream));
        }
        self.r.finish_sse(stream, Some(reason));
    }

    fn events(&mut self) -> Vec<Event> {
        self.r.drain()
    }
}

fn span(
    stream: u16,
    start: u64,
    text: &str,
    step: Option<u32>,
    first: u64,
    n: u32,
    role: Option<u8>,
) -> Event {
    Event::Span {
        stream,
        byte_start: start,
        text: text.into(),
        step,
        first_offset: first,
        n_tokens: n,
        role,
    }
}

fn failed(stream: u16, reason: &str) -> Event {
    Event::Failed {
        stream,
        reason: reason.into(),
    }
}

fn last_failure(ev: &[Event]) -> String {
    ev.iter()
        .rev()
        .find_map(|e| match e {
            Event::Failed { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

mod attribution;
mod finalize;
mod lies;
mod rules;
