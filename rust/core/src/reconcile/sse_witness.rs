//! The SSE witness's inputs (docs/PROTOCOL.md "SSE inputs"): what the
//! client's own stream received, and the rules that hold it against the others.

use super::*;

impl Reconciler {
    /// The stream an SSE input is for, if it can still change.
    pub(super) fn sse_stream(&mut self, stream: u16) -> Option<usize> {
        self.begin_input();
        let s = stream as usize;
        if self.finalized || s >= self.streams.len() || self.streams[s].failed.is_some() {
            return None;
        }
        Some(s)
    }

    /// The stream an SSE input is for, if it can still change and its SSE
    /// body has not ended (SSE data after the end is a contradiction).
    pub(super) fn sse_open(&mut self, stream: u16) -> Option<usize> {
        let s = self.sse_stream(stream)?;
        if self.streams[s].sse_finished {
            self.fail(s, format!("stream {s}: SSE data after the stream finished"));
            return None;
        }
        Some(s)
    }

    /// One SSE delta of a stream (its choice 0): text and token ids.
    pub fn push_sse(&mut self, stream: u16, text: &str, token_ids: &[u32]) {
        let Some(s) = self.sse_open(stream) else {
            return;
        };
        let st = &self.streams[s];
        let before = st.confirmed_end();
        let waiting_for_bytes = st.fragment_waits_for_bytes(before);
        if let Err(reason) = self.streams[s].add_sse(s, text, token_ids) {
            return self.fail(s, reason);
        }
        let st = &self.streams[s];
        let noop =
            (!waiting_for_bytes || st.front_still_waits()) && st.advance_is_noop_after_sse(before);
        #[cfg(test)]
        {
            self.skipped_waiting += u64::from(waiting_for_bytes && noop && self.skip_advance);
        }
        self.advance_unless_noop(s, noop, 2);
    }

    /// The `id` of the stream's SSE chunks (pushed for its first chunk and
    /// whenever it differs from the previous chunk's): it must carry the
    /// stream's request id and never change.
    pub fn push_sse_id(&mut self, stream: u16, chunk_id: &str) {
        let Some(s) = self.sse_open(stream) else {
            return;
        };
        let request_id = format!("ph1_{}_{s}", run_id_hex(&self.run_id));
        let st = &mut self.streams[s];
        let reason = if !carries_request_id(chunk_id, &request_id) {
            let whose = if is_pd_router_id(chunk_id) {
                PD_ROUTER_NOTE
            } else {
                ""
            };
            format!("stream {s}: SSE chunk id does not carry the request id {request_id}{whose}")
        } else if st.sse_id.as_deref().is_some_and(|id| id != chunk_id) {
            format!("stream {s}: SSE chunk id changed mid-stream")
        } else {
            st.sse_id = Some(chunk_id.to_owned());
            return;
        };
        self.fail(s, reason);
    }

    /// The stream's chunks carried a choice other than the single choice 0:
    /// another choice's text may be in what the client showed.
    pub fn push_sse_choice(&mut self, stream: u16, index: u32) {
        let Some(s) = self.sse_open(stream) else {
            return;
        };
        self.fail(
            s,
            format!("stream {s}: SSE chunk with a choice other than the single choice 0 (index {index})"),
        );
    }

    /// The usage chunk: `usage.completion_tokens` and vLLM's per-request
    /// speculative-decoding metrics (`metrics.speculative_decoding`).
    pub fn push_sse_usage(
        &mut self,
        stream: u16,
        completion_tokens: Option<u64>,
        per_step_accepted: Option<&[u32]>,
        per_step_drafted: Option<&[u32]>,
    ) {
        let Some(s) = self.sse_open(stream) else {
            return;
        };
        let st = &mut self.streams[s];
        let checked = st
            .usage_rules(s, completion_tokens, per_step_accepted, per_step_drafted)
            .and_then(|()| st.metrics_rules(s));
        if let Err(reason) = checked {
            self.fail(s, reason);
        }
    }

    /// The stream's SSE body ended normally; `finish_reason` is the last
    /// non-null `finish_reason` of its choice 0.
    pub fn finish_sse(&mut self, stream: u16, finish_reason: Option<&str>) {
        let Some(s) = self.sse_open(stream) else {
            return;
        };
        let st = &mut self.streams[s];
        st.sse_finished = true;
        st.sse_reason = finish_reason.map(str::to_owned);
        if let Err(reason) = st.sse_end_rules(s) {
            return self.fail(s, reason);
        }
        self.advance(s);
    }
}

/// Said after the reason when the chunk id is the one vllm-router's P/D mode gives
/// both stages (docs/REACH.md): the router renamed the request, no server bug.
const PD_ROUTER_NOTE: &str = " (a prefill/decode router renamed the request)";

/// vllm-router's P/D request id, `___prefill_addr_<url>___decode_addr_<url>_<uuid>`.
fn is_pd_router_id(chunk_id: &str) -> bool {
    chunk_id
        .split_once("___prefill_addr_")
        .is_some_and(|(_, rest)| rest.contains("___decode_addr_"))
}

/// `chunk_id` holds `request_id` (`ph1_<run>_<stream>`) not followed by
/// another digit (`ph1_<run>_1` is not in `..._12`).
pub(super) fn carries_request_id(chunk_id: &str, request_id: &str) -> bool {
    chunk_id.match_indices(request_id).any(|(i, m)| {
        !chunk_id[i + m.len()..]
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_digit())
    })
}
