//! Frame admission (docs/PROTOCOL.md "Frame admission"): decoding, the run id,
//! per-source sequencing and duplicates, hellos and roles, losses; then each
//! record goes to its stream.

use super::*;
use crate::protocol::HelloFields;

impl Reconciler {
    /// Count a datagram rejected before decoding (e.g. by the receiver).
    pub fn reject(&mut self, reason: String) {
        self.counters.frames += 1;
        if self.finalized {
            return self.late_frame();
        }
        self.reject_message(reason);
    }

    /// Telemetry lost between the server and this client, not by a sender
    /// (docs/PROTOCOL.md, "Lost telemetry"): `Some(n)` frames the server's hub
    /// discarded for this client (a `dropped` item), `None` an unknown number
    /// (the telemetry stream ended before the run). Like any frame loss it
    /// fails every stream without a final verdict, an exact one too (a lost
    /// frame may have been a notice for it); `Some(0)` lost nothing.
    pub fn push_lost(&mut self, frames: Option<u64>) {
        self.begin_input();
        let reason = match frames {
            Some(0) => return,
            Some(n) => format!("telemetry lost: {n} frames dropped by the server"),
            None => "telemetry lost: the telemetry stream ended before the run".to_owned(),
        };
        self.frames_lost(&reason);
    }

    /// A stream's in-band telemetry is missing frames (docs/PROTOCOL.md,
    /// "In-band telemetry"): its response said so, or ended before its
    /// telemetry did. Only that stream fails (an exact one is revoked before
    /// `finalize()`); the frames travel in its own response, so no other
    /// stream can have lost one.
    pub fn push_stream_lost(&mut self, stream: u16, reason: &str) {
        self.begin_input();
        if usize::from(stream) < self.streams.len() {
            self.fail(usize::from(stream), reason.to_owned());
        }
    }

    /// Push one datagram.
    pub fn push_frame(&mut self, data: &[u8]) {
        self.begin_input();
        self.counters.frames += 1;
        if self.finalized {
            return self.late_frame();
        }
        let frame = match protocol::decode_reusing(data, &mut self.record_bufs) {
            Ok(f) => f,
            Err(e) => return self.rejected(&e),
        };
        self.admit(data, &frame);
        self.record_bufs.recycle(frame.body);
    }

    /// A decoded frame: its run, source and sequence number.
    fn admit(&mut self, data: &[u8], frame: &Frame<'_>) {
        let h = frame.header;
        if h.run_id != self.run_id {
            return self.reject_message(format!(
                "frame for run {}, expected {}",
                run_id_hex(&h.run_id),
                run_id_hex(&self.run_id)
            ));
        }
        self.admitted = true;
        let digest = self.digest.digest(data);
        let source = match self.sources.get_mut(h.source_id) {
            Some(s) => s,
            None => self.sources.push(
                h.source_id,
                Source {
                    seq: SeqTracker::default(),
                    digests: Digests::default(),
                    role: None,
                    info: 0,
                    broken: false,
                },
            ),
        };
        // A buffered frame keeps its bytes and is decoded again when released.
        match source.seq.offer(h.seq, || data.to_vec()) {
            Offer::Duplicate => {
                self.counters.duplicate_frames += 1;
                // A sequence number given up after a gap has no digest: nothing to compare.
                if source.digests.get(h.seq).is_some_and(|d| d != digest) {
                    self.run_failure(format!(
                        "source {:016x}: seq {} received twice with different content",
                        h.source_id, h.seq
                    ));
                }
            }
            Offer::Buffered => {
                source.digests.insert(h.seq, digest);
            }
            Offer::Release => {
                source.digests.insert(h.seq, digest);
                // Releasing a frame never buffers one, so with nothing buffered
                // now there is nothing to drain: skip its map lookup.
                let buffered = source.seq.buffered_len() > 0;
                self.release(frame);
                if buffered {
                    self.drain_source(h.source_id);
                }
            }
            Offer::Gap { missing } => {
                self.counters.gaps += 1;
                source.digests.insert(h.seq, digest);
                self.frames_lost(&format!(
                    "frames lost: gap in source {:016x} at seq {missing}",
                    h.source_id
                ));
                self.drain_source(h.source_id);
            }
        }
    }

    /// Push several datagrams.
    pub fn push_frames<'a>(&mut self, frames: impl IntoIterator<Item = &'a [u8]>) {
        for f in frames {
            self.push_frame(f);
        }
    }

    /// A frame after `finalize()`: counted, reported once, not used.
    pub(super) fn late_frame(&mut self) {
        self.counters.late_frames += 1;
        if self.counters.late_frames == 1 {
            self.events.push(Event::Run {
                message: LATE_MESSAGE.to_owned(),
            });
        }
    }

    pub(super) fn rejected(&mut self, e: &DecodeError) {
        self.reject_message(e.to_string());
    }

    /// A rejected frame: counted, and reported as a run event.
    pub(super) fn reject_message(&mut self, message: String) {
        self.counters.rejected_frames += 1;
        self.events.push(Event::Run {
            message: format!("rejected frame: {message}"),
        });
    }

    pub(super) fn drain_source(&mut self, source_id: u64) {
        loop {
            let Some(bytes) = self
                .sources
                .get_mut(source_id)
                .and_then(|s| s.seq.pop_ready())
            else {
                return;
            };
            if let Ok(frame) = protocol::decode_reusing(&bytes, &mut self.record_bufs) {
                self.release(&frame);
                self.record_bufs.recycle(frame.body);
            }
        }
    }

    /// Process a frame released in sequence order.
    pub(super) fn release(&mut self, frame: &Frame<'_>) {
        let h = &frame.header;
        let src = h.source_id;
        let Some(source) = self.sources.get_mut(src) else {
            return;
        };
        if source.broken {
            return;
        }
        let kind = h.kind.name();
        match (&frame.body, source.role) {
            (Body::Hello(hello), Some(_)) => {
                // The same hello again changes nothing; another one contradicts the first.
                if self.infos[source.info].hello == HelloFields::from(hello) {
                    return self.reject_message(format!("second hello from source {src:016x}"));
                }
                return self.run_failure(format!(
                    "source {src:016x}: a second hello that differs from its first"
                ));
            }
            (Body::Hello(hello), None) => {
                source.role = Some(hello.role);
                source.info = self.infos.len();
                self.infos.push(SourceInfo::from_hello(src, hello));
            }
            (_, None) => {
                source.broken = true;
                return self
                    .run_failure(format!("source {src:016x}: {kind} frame before its hello"));
            }
            (Body::Provenance(_), Some(role)) if role != ROLE_SCHEDULER => {
                return self.run_failure(format!(
                    "source {src:016x}: {kind} frame from a {} source",
                    role_name(role)
                ));
            }
            (Body::Text(_), Some(role)) if role != ROLE_FRONTEND => {
                return self.run_failure(format!(
                    "source {src:016x}: {kind} frame from a {} source",
                    role_name(role)
                ));
            }
            _ => {}
        }
        self.counters.dropped_reported += u64::from(h.dropped);
        if h.dropped > 0 {
            self.frames_lost(&format!(
                "frames lost: source {src:016x} dropped {} frames before seq {}",
                h.dropped, h.seq
            ));
        }
        match &frame.body {
            Body::Provenance(recs) => {
                let k = self.infos[source_info(&self.sources, src)]
                    .hello
                    .num_speculative_tokens;
                for r in recs {
                    self.on_provenance(src, h.step, k, r);
                }
            }
            Body::Text(recs) => {
                for r in recs {
                    self.on_text(src, h.step, r);
                }
            }
            Body::Notice(recs) => {
                for r in recs {
                    self.on_notice(src, r);
                }
            }
            Body::Hello(_) => {}
        }
    }

    /// The run's telemetry contradicts itself: a run event, then every
    /// stream without a final verdict fails (an exact one is revoked).
    pub(super) fn run_failure(&mut self, message: String) {
        self.events.push(Event::Run {
            message: message.clone(),
        });
        for s in 0..self.streams.len() {
            self.fail(s, message.clone());
        }
    }

    /// Frames were lost: every stream without a final verdict fails, an
    /// exact one is revoked (a lost frame may have been a notice for it).
    pub(super) fn frames_lost(&mut self, reason: &str) {
        for s in 0..self.streams.len() {
            self.fail(s, reason.to_owned());
        }
    }

    /// Fail an open stream, or revoke an exact one (before `finalize()`).
    pub(super) fn fail(&mut self, s: usize, reason: String) {
        let st = &mut self.streams[s];
        if st.failed.is_some() || self.finalized {
            return;
        }
        st.release_all();
        st.exact = false;
        st.failed = Some(reason.clone());
        self.events.push(Event::Failed {
            stream: s as u16,
            reason,
        });
    }

    /// Index of a stream named by a record whose verdict may still change,
    /// counting foreign records.
    pub(super) fn record_stream(&mut self, stream: u16) -> Option<usize> {
        let s = stream as usize;
        if s >= self.streams.len() {
            self.counters.foreign_records += 1;
            return None;
        }
        self.streams[s].failed.is_none().then_some(s)
    }

    pub(super) fn on_notice(&mut self, src: u64, r: &NoticeRecord<'_>) {
        let reason = format!(
            "not exact: {} (notice {} from source {src:016x})",
            r.message, r.code
        );
        if r.stream == ALL_STREAMS {
            for s in 0..self.streams.len() {
                self.fail(s, reason.clone());
            }
        } else if let Some(s) = self.record_stream(r.stream) {
            self.fail(s, reason);
        }
    }

    pub(super) fn on_provenance(&mut self, src: u64, step: u64, k: u16, r: &ProvRecord<'_>) {
        let Some(s) = self.record_stream(r.stream) else {
            return;
        };
        let st = &self.streams[s];
        let pair = match (st.p_src, st.t_src) {
            (None, Some(t)) => self.hello_pair(s, src, t),
            _ => None,
        };
        let before = self.streams[s].confirmed_end();
        if let Err(reason) = self.streams[s].add_provenance(s, src, step, k, pair, r) {
            return self.fail(s, reason);
        }
        let noop = self.streams[s].advance_is_noop_after_provenance(before);
        self.advance_unless_noop(s, noop, 0);
    }

    pub(super) fn on_text(&mut self, src: u64, step: u64, r: &TextRecord<'_>) {
        let Some(s) = self.record_stream(r.stream) else {
            return;
        };
        let st = &self.streams[s];
        let pair = match (st.p_src, st.t_src) {
            (Some(p), None) => self.hello_pair(s, p, src),
            _ => None,
        };
        let st = &self.streams[s];
        let before = st.confirmed_end();
        let waiting_for_bytes = st.fragment_waits_for_bytes(before);
        if let Err(reason) = self.streams[s].add_text(s, src, step, pair, r) {
            return self.fail(s, reason);
        }
        let st = &self.streams[s];
        let noop =
            (!waiting_for_bytes || st.front_still_waits()) && st.advance_is_noop_after_text(before);
        #[cfg(test)]
        {
            self.skipped_waiting += u64::from(waiting_for_bytes && noop && self.skip_advance);
        }
        self.advance_unless_noop(s, noop, 1);
    }

    /// `advance(s)`, unless `noop` proved after an input of kind `kind`
    /// (0 provenance, 1 text, 2 SSE) that it would change nothing
    /// (`prove.rs`, `advance_is_noop_after_*`).
    #[inline]
    pub(super) fn advance_unless_noop(&mut self, s: usize, noop: bool, kind: usize) {
        if self.skip_advance && noop {
            #[cfg(test)]
            {
                self.skipped[kind] += 1;
            }
            #[cfg(not(test))]
            let _ = kind;
            return;
        }
        self.advance(s);
    }

    /// The scheduler's and the frontend's hellos of a stream must name the
    /// same engine, engine version and plugin version.
    pub(super) fn hello_pair(&self, s: usize, sched: u64, front: u64) -> Option<String> {
        let a = &self.infos[source_info(&self.sources, sched)];
        let b = &self.infos[source_info(&self.sources, front)];
        let fields = [
            ("engine", a.engine_name(), b.engine_name()),
            (
                "engine_version",
                a.hello.engine_version.as_str(),
                b.hello.engine_version.as_str(),
            ),
            (
                "plugin_version",
                a.hello.plugin_version.as_str(),
                b.hello.plugin_version.as_str(),
            ),
        ];
        fields.iter().find(|(_, x, y)| x != y).map(|(field, x, y)| {
            format!(
                "stream {s}: the scheduler's and the frontend's hellos disagree on {field} \
                 ('{x}' vs '{y}')"
            )
        })
    }
}
