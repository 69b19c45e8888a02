//! The HTTP telemetry stream's way into the run: what the HTTP thread has
//! seen of it ([`TelemetryState`], [`TelemetryEnd`]), and its items held
//! until the client accepts the run the preamble named, then pushed under
//! the run's lock exactly like the socket's datagrams.

use std::sync::Mutex;

use super::telemetry_body::BodyEnd;
use crate::fed::Fed;
use crate::outcome::{EndKind, Outcome};
use crate::telemetry::stream::{Preamble, StreamItem};

/// How the telemetry stream ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TelemetryEnd {
    /// The exchange failed before a telemetry body, or its connection did
    /// (refused, TLS, an HTTP status, another content type, a timeout, a reset).
    Exchange(Outcome),
    /// The body ended: the server's end item, or its framing broke.
    Body(BodyEnd),
}

/// The telemetry stream of a run, as the HTTP thread has seen it so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TelemetryState {
    pub subscribed: bool,
    /// The stream's preamble: the run the server created for this client.
    pub preamble: Option<Preamble>,
    /// The client took the run: frames go into the run's reconciler.
    pub accepted: bool,
    /// Frame items handed to the reconciler, and their bytes.
    pub frames: u64,
    pub bytes: u64,
    /// Frames the server's hub discarded for this client (sum of `dropped` items).
    pub dropped: u64,
    pub heartbeats: u64,
    /// Set once, when the stream is over (None while it is open, and when
    /// the client closed it at the end of the run).
    pub end: Option<TelemetryEnd>,
}

/// The telemetry stream's items on their way into the run.
#[derive(Default)]
pub(crate) struct Link {
    /// Items read but not yet handed to the run (held until it is accepted).
    pub(crate) items: Vec<StreamItem>,
    /// The stream ended; handed to the state once the items before it are.
    pub(crate) end: Option<TelemetryEnd>,
    pub(crate) accept: bool,
    /// The run's reconciler was told that the stream ended early.
    end_told: bool,
}

impl Link {
    /// The telemetry stream's news, under the run's lock: the preamble as
    /// soon as it is read; frames only once the client accepted the run (in
    /// the order they were read); the end after the items before it.
    pub(crate) fn publish(&mut self, telemetry: &Mutex<TelemetryState>, fed: &mut Fed, time: f64) {
        let Ok(mut state) = telemetry.lock() else {
            return;
        };
        let link = self;
        if state.preamble.is_none() {
            if let Some(StreamItem::Preamble(p)) = link.items.first() {
                state.preamble = Some(p.clone());
                link.items.remove(0);
            }
        }
        if link.accept && !state.accepted {
            if let Some(p) = &state.preamble {
                match fed.bind_run(p.run_id) {
                    Ok(()) => state.accepted = true,
                    Err(e) => {
                        link.items.clear();
                        link.end = Some(TelemetryEnd::Exchange(Outcome::failed(
                            EndKind::Internal,
                            e,
                        )));
                    }
                }
            }
        }
        if state.accepted {
            for item in link.items.drain(..) {
                match item {
                    StreamItem::Frame(frame) => {
                        state.frames += 1;
                        state.bytes += frame.len() as u64;
                        fed.push_frame_at(&frame, time);
                    }
                    StreamItem::Dropped { frames } => {
                        // In stream order: the frames after it are not among the lost.
                        state.dropped += u64::from(frames);
                        fed.push_lost_at(Some(u64::from(frames)), time);
                    }
                    StreamItem::Heartbeat => state.heartbeats += 1,
                    StreamItem::Preamble(_) | StreamItem::End { .. } => {}
                }
            }
        }
        let held = !state.accepted && state.preamble.is_some() && !link.items.is_empty();
        if !held {
            if let Some(end) = link.end.take() {
                state.end = Some(end);
            }
        }
        // The client closes the stream only after the run, so any end seen
        // here comes before it: what the server sends from now on is lost.
        if state.accepted && state.end.is_some() && !link.end_told {
            link.end_told = true;
            fed.push_lost_at(None, time);
        }
    }
}
