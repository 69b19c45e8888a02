//! [`HttpStreams`]: the handle of a run's HTTP thread. Commands go in
//! through a shared list and a wake-up.

use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::thread::{Command, ReadOptions, Shared, Thread};
use super::{Target, Timeouts};
use crate::fed::{monotonic, Fed};
use crate::outcome::{EndKind, Outcome};
use crate::sys::{self, Waker};

/// The HTTP thread of a run.
pub struct HttpStreams {
    shared: Arc<Mutex<Shared>>,
    /// Wakes the thread for a command or the stop (None once closed).
    wake: Option<Waker>,
    stop: Arc<AtomicBool>,
    /// Set when the thread ended by a panic: nothing it held will finish.
    failed: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HttpStreams {
    /// Start the thread; streams' deltas and ends go into `fed`.
    pub fn start(
        fed: Arc<Mutex<Fed>>,
        target: Target,
        timeouts: Timeouts,
        min_interval: Duration,
    ) -> io::Result<HttpStreams> {
        Self::start_with(fed, target, timeouts, min_interval, ReadOptions::default())
    }

    pub(crate) fn start_with(
        fed: Arc<Mutex<Fed>>,
        target: Target,
        timeouts: Timeouts,
        min_interval: Duration,
        options: ReadOptions,
    ) -> io::Result<HttpStreams> {
        let (wake_r, wake_w) = sys::wake_pipe()?;
        let shared = Arc::new(Mutex::new(Shared::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(AtomicBool::new(false));
        let (t_shared, t_stop, t_failed) =
            (Arc::clone(&shared), Arc::clone(&stop), Arc::clone(&failed));
        let spawned = std::thread::Builder::new()
            .name("parallelhue-http".into())
            .spawn(move || {
                let mut thread = Thread {
                    wake: &wake_r,
                    shared: &t_shared,
                    stop: &t_stop,
                    fed: &fed,
                    target,
                    timeouts,
                    min_interval,
                    addrs: None,
                    options,
                };
                if catch_unwind(AssertUnwindSafe(|| thread.run())).is_err() {
                    t_failed.store(true, Ordering::SeqCst);
                }
            })?;
        Ok(HttpStreams {
            shared,
            wake: Some(wake_w),
            stop,
            failed,
            thread: Some(spawned),
        })
    }

    fn command(&self, command: Command) {
        if let Ok(mut s) = self.shared.lock() {
            s.commands.push(command);
        }
        if let Some(wake) = &self.wake {
            wake.wake();
        }
    }

    /// Start stream `stream` with the whole request (head and body); returns
    /// its start time (monotonic seconds), recorded as such.
    pub fn add(&self, stream: u16, request: Vec<u8>) -> f64 {
        let at = monotonic();
        self.command(Command::Add {
            stream,
            request,
            at,
        });
        at
    }

    /// Stop `stream`: its connection closes and it ends as cancelled. A
    /// stream whose exchange is already over gets the end too (recorded and
    /// reported), so the recording says which streams the client stopped.
    pub fn cancel(&self, stream: u16) {
        self.stop(stream, Outcome::failed(EndKind::Cancelled, ""));
    }

    /// End `stream` with `outcome` (e.g. the client failed handling it),
    /// like [`HttpStreams::cancel`].
    pub fn stop(&self, stream: u16, outcome: Outcome) {
        self.command(Command::Stop { stream, outcome });
    }

    pub fn is_closed(&self) -> bool {
        self.thread.is_none()
    }

    /// The thread died (a bug): the streams it held will never finish.
    pub fn has_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Stop the thread and close every connection. Idempotent.
    pub fn close(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.stop.store(true, Ordering::SeqCst);
        if let Some(wake) = self.wake.take() {
            wake.wake();
        }
        let _ = thread.join();
    }
}

impl Drop for HttpStreams {
    fn drop(&mut self) {
        self.close();
    }
}
