//! The HTTP thread's loop: wait for the connections, drive each ready
//! exchange, take the commands, apply the timeouts, and publish the round:
//! each exchange's start, SSE inputs (in-band telemetry frames among them)
//! and end, handed to the run under one lock.

use std::net::{SocketAddr, ToSocketAddrs};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::exchange::{strerror, Exchange};
use super::waiter::Waiter;
use super::{Target, Timeouts, COALESCE_STREAMS};
use crate::fed::{monotonic, Ended, Fed};
use crate::outcome::{EndKind, Outcome};
use crate::sys::WakeReceiver;

/// Bytes read by one `recv`.
const READ_BYTES: usize = 256 * 1024;

/// What the handle ([`super::HttpStreams`]) asks of the thread.
pub(super) enum Command {
    Add {
        stream: u16,
        request: Vec<u8>,
        at: f64,
    },
    /// End the stream with this outcome (cancelled, or failed by the client).
    Stop { stream: u16, outcome: Outcome },
}

/// The commands not yet taken by the thread.
#[derive(Default)]
pub(super) struct Shared {
    pub(super) commands: Vec<Command>,
}

/// The thread's own state; what it shares, it borrows from its closure.
pub(super) struct Thread<'a> {
    pub(super) wake: &'a WakeReceiver,
    pub(super) shared: &'a Mutex<Shared>,
    pub(super) stop: &'a AtomicBool,
    pub(super) fed: &'a Mutex<Fed>,
    pub(super) target: Target,
    pub(super) timeouts: Timeouts,
    pub(super) min_interval: Duration,
    /// The target's addresses, looked up once (or why the lookup failed).
    pub(super) addrs: Option<Result<Vec<SocketAddr>, String>>,
    pub(super) options: ReadOptions,
}

/// How the thread reads its connections (tests shrink the reads and pick the waiter).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadOptions {
    /// Bytes read by one `recv`.
    pub read_bytes: usize,
    /// Wait with edge-triggered epoll where there is one (Linux), else `poll`.
    pub edges: bool,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            read_bytes: READ_BYTES,
            edges: true,
        }
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

impl Thread<'_> {
    fn resolve(&mut self) -> Result<Vec<SocketAddr>, String> {
        if self.addrs.is_none() {
            let found = (self.target.host.as_str(), self.target.port)
                .to_socket_addrs()
                .map(|a| a.collect::<Vec<_>>())
                .map_err(|e| {
                    let text = strerror(&e);
                    text.strip_prefix("failed to lookup address information: ")
                        .unwrap_or(&text)
                        .to_owned()
                });
            self.addrs = Some(found);
        }
        self.addrs
            .clone()
            .unwrap_or_else(|| Err("no lookup".into()))
    }

    fn start_exchange(&mut self, stream: u16, request: Vec<u8>, now: Instant, at: f64) -> Exchange {
        let mut ex = Exchange::new(stream, request, now, at);
        match self.resolve() {
            Ok(addrs) => {
                ex.addrs = addrs;
                ex.connect_next(&self.target, None);
            }
            Err(reason) => ex.fail(Outcome::failed(
                EndKind::ConnectFailed,
                format!("{}: {reason}", self.target.shown),
            )),
        }
        ex
    }

    pub(super) fn run(&mut self) {
        let mut exchanges: Vec<Exchange> = Vec::new();
        let mut buf = vec![0u8; self.options.read_bytes];
        let mut waiter = Waiter::new(self.wake, self.options.edges);
        let mut revents: Vec<libc::c_short> = Vec::new();
        loop {
            let round_start = Instant::now();
            let wait_ms = exchanges
                .iter()
                .filter_map(|ex| ex.deadline(&self.timeouts))
                .map(|(at, _)| at.saturating_duration_since(round_start))
                .min()
                .map_or(-1, |d| {
                    d.as_millis().min(i32::MAX as u128) as libc::c_int + 1
                });
            waiter.wait(self.wake, &mut exchanges, wait_ms, &mut revents);
            let time = monotonic();
            let now = Instant::now();
            let mut ready = 0;
            for (i, ex) in exchanges.iter_mut().enumerate() {
                let revents = revents[i];
                if revents == 0 || ex.end.is_some() {
                    continue;
                }
                ready += 1;
                let target = &self.target;
                let buf = &mut buf;
                if let Err(payload) = catch_unwind(AssertUnwindSafe(|| {
                    ex.drive(target, revents, buf, time, now)
                })) {
                    ex.fail(Outcome::failed(
                        EndKind::Internal,
                        format!(
                            "the HTTP thread failed on this stream: {}",
                            panic_message(&*payload)
                        ),
                    ));
                }
            }
            let commands = match self.shared.lock() {
                Ok(mut s) => std::mem::take(&mut s.commands),
                Err(_) => Vec::new(),
            };
            let mut stops: Vec<(u16, Outcome)> = Vec::new();
            for command in commands {
                match command {
                    Command::Add {
                        stream,
                        request,
                        at,
                    } => {
                        let ex = self.start_exchange(stream, request, now, at);
                        exchanges.push(ex);
                    }
                    Command::Stop { stream, outcome } => stops.push((stream, outcome)),
                }
            }
            for ex in &mut exchanges {
                if ex.end.is_none() {
                    if let Some((at, outcome)) = ex.deadline(&self.timeouts) {
                        if now >= at {
                            ex.fail(outcome);
                        }
                    }
                }
            }
            self.publish(&mut exchanges, stops);
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            // Coalesce when many streams are open: the next round's reads then
            // bring several chunks each, and an engine step's burst of 64 chunks
            // is read in one or two rounds instead of one round per chunk.
            let spent = round_start.elapsed();
            if ready > 0 && exchanges.len() >= COALESCE_STREAMS && spent < self.min_interval {
                std::thread::sleep(self.min_interval - spent);
            }
        }
    }
}

impl Thread<'_> {
    /// Hand the round's starts, deltas and ends to the run (one lock).
    pub(super) fn publish(
        &mut self,
        exchanges: &mut Vec<Exchange>,
        mut stops: Vec<(u16, Outcome)>,
    ) {
        let busy = exchanges
            .iter()
            .any(|ex| ex.start_at.is_some() || !ex.response.deltas.is_empty() || ex.end.is_some());
        if !busy && stops.is_empty() {
            exchanges.retain(|ex| !ex.done);
            return;
        }
        let mut fed = self.fed.lock().unwrap_or_else(|poisoned| {
            // The reconciler panicked under another caller: nothing it says
            // can be trusted any more, so this thread stops (the client then
            // fails every unfinished stream).
            drop(poisoned);
            panic!("the run's reconciler failed")
        });
        let time = monotonic();
        for ex in exchanges.iter_mut() {
            if let Some(at) = ex.start_at.take() {
                fed.stream_started(ex.stream, at);
            }
            if ex.end.is_none() {
                if let Some(i) = stops.iter().position(|(s, _)| *s == ex.stream) {
                    let (_, outcome) = stops.swap_remove(i);
                    ex.fail(outcome);
                }
            }
            ex.response.deltas.publish(&mut fed, ex.stream);
            if let Some(outcome) = ex.end.take() {
                ex.sock = None;
                ex.tls = None;
                let (finish_reason, usage) = match &ex.response.body {
                    Some(b) => (b.finish_reason.clone(), b.usage.clone()),
                    None => (None, None),
                };
                fed.stream_ended(Ended {
                    stream: ex.stream,
                    outcome,
                    finish_reason,
                    usage,
                    at: time,
                });
                ex.done = true;
            }
        }
        exchanges.retain(|ex| !ex.done);
        // Stops of streams whose exchange is already over.
        for (stream, outcome) in stops {
            fed.stream_ended(Ended {
                stream,
                outcome,
                finish_reason: None,
                usage: None,
                at: time,
            });
        }
    }
}
