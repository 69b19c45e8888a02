//! The telemetry socket (Linux): an `AF_UNIX` datagram socket bound at the
//! run's path with mode 0600 and `SO_PASSCRED`, read by a dedicated thread.
//! Each datagram's `SCM_CREDENTIALS` are checked: datagrams from another uid
//! are dropped and counted, unless the user accepted that uid explicitly
//! (`--accept-uid`, docs/PROTOCOL.md "Security of the telemetry paths"; the
//! socket is then 0622 so that uid can reach it, and every datagram admitted
//! that way is counted). Accepted datagrams are pushed, in batches, into
//! the run's [`Fed`] (tap and reconciler under one lock), with the time of
//! the read. No Python is involved: the thread never needs the GIL.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::fed::{monotonic, Fed};
use crate::protocol::MAX_FRAME_BYTES;
use crate::sys::{self, CmsgBuf, Datagram, WakeReceiver, Waker};

pub use super::ReceiverStats;

/// Datagrams read per batch before the reconciler is locked once for all.
const BATCH: usize = 64;
/// The longest the thread lets datagrams queue in the kernel after a read
/// ([`next_pause`]); the HTTP thread's `DEFAULT_MIN_INTERVAL`, so a frame
/// waits no longer than an SSE delta does.
pub const DEFAULT_MAX_PAUSE: Duration = Duration::from_millis(10);
/// The shortest pause worth a wake-up: below it the rate seen is so high (or
/// a burst was read while it was still arriving) that the next wait in
/// `poll` finds several datagrams anyway.
const MIN_PAUSE: Duration = Duration::from_millis(1);
/// `net.unix.max_dgram_qlen` when it cannot be read (the kernel's default).
const DEFAULT_QLEN: usize = 10;
/// Where the kernel says how many datagrams a socket queues before senders wait.
const QLEN_PATH: &str = "/proc/sys/net/unix/max_dgram_qlen";
/// `last_rejected_uid` before any datagram was rejected (or one came without credentials).
const NO_UID: u64 = u64::MAX;

/// Receiver counters.
#[derive(Debug, Default)]
pub struct ReceiverCounters {
    /// Datagrams accepted and pushed to the reconciler.
    pub received: AtomicU64,
    /// Bytes of those datagrams.
    pub bytes: AtomicU64,
    /// Datagrams from another uid (or without credentials), dropped.
    pub rejected_uid: AtomicU64,
    /// The uid of the last datagram rejected for its uid (`NO_UID`: none yet).
    pub last_rejected_uid: AtomicU64,
    /// Datagrams admitted because their uid was accepted explicitly.
    pub accepted_foreign: AtomicU64,
    /// Datagrams larger than `MAX_FRAME_BYTES` (rejected as oversized frames).
    pub oversized: AtomicU64,
    /// Times the reconciler was locked for a batch.
    pub batches: AtomicU64,
    /// Waits of the thread (in poll for an arrival, or a pause).
    pub wakeups: AtomicU64,
    /// recvmsg/poll failures other than EAGAIN/EINTR.
    pub errors: AtomicU64,
    /// The thread is between reading datagrams and having pushed them.
    pub busy: AtomicBool,
}

/// A bound socket and its reading thread.
pub struct Receiver {
    path: PathBuf,
    /// The socket; the thread holds it too while it runs.
    sock: Option<Arc<OwnedFd>>,
    wake: Option<Waker>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<ReceiverCounters>,
    rcvbuf: u64,
}

impl Receiver {
    /// Bind `path` (which must not exist) and start reading into `sink`.
    /// `rcvbuf` is the requested receive buffer in bytes
    /// (`SO_RCVBUFFORCE` when permitted, else `SO_RCVBUF`, capped by the kernel).
    /// Datagrams from `accept_uids` are admitted besides this process's own uid.
    pub fn bind(
        path: &Path,
        rcvbuf: usize,
        sink: Arc<Mutex<Fed>>,
        accept_uids: &[u32],
    ) -> io::Result<Receiver> {
        Receiver::bind_with(path, rcvbuf, sink, accept_uids, DEFAULT_MAX_PAUSE)
    }

    /// [`Receiver::bind`] with the longest pause between reads (zero: read
    /// as soon as a datagram arrives, one wake-up per arrival).
    pub fn bind_with(
        path: &Path,
        rcvbuf: usize,
        sink: Arc<Mutex<Fed>>,
        accept_uids: &[u32],
        max_pause: Duration,
    ) -> io::Result<Receiver> {
        let me = sys::euid();
        let accept: Vec<u32> = accept_uids.iter().copied().filter(|&u| u != me).collect();
        // Root reaches any socket; another accepted uid needs write permission.
        let mode = if accept.iter().any(|&u| u != 0) {
            0o622
        } else {
            0o600
        };
        let want = rcvbuf.min(libc::c_int::MAX as usize) as libc::c_int;
        let sock = Arc::new(sys::bind_datagrams(path, mode, want, me == 0)?);
        // Make sure of the mode even where fchmod before bind is not honoured.
        let _ = std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode));
        let rcvbuf = sys::receive_buffer(sock.as_fd()).unwrap_or(0).max(0) as u64;
        let (wake_r, wake_w) = match sys::wake_pipe() {
            Ok(ends) => ends,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(e);
            }
        };
        let counters = Arc::new(ReceiverCounters {
            last_rejected_uid: AtomicU64::new(NO_UID),
            ..ReceiverCounters::default()
        });
        let thread_sock = Arc::clone(&sock);
        let thread_counters = Arc::clone(&counters);
        let spawned = std::thread::Builder::new()
            .name("parallelhue-receiver".into())
            .spawn(move || {
                let pace = Pace {
                    max: max_pause,
                    qlen: queue_limit(),
                };
                read_loop(
                    &thread_sock,
                    &wake_r,
                    &sink,
                    &thread_counters,
                    me,
                    &accept,
                    pace,
                );
            });
        let thread = match spawned {
            Ok(t) => t,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(e);
            }
        };
        Ok(Receiver {
            path: path.to_path_buf(),
            sock: Some(sock),
            wake: Some(wake_w),
            thread: Some(thread),
            counters,
            rcvbuf,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_closed(&self) -> bool {
        self.thread.is_none()
    }

    /// Whether datagrams that arrived before this call may still be on their way
    /// into the reconciler: queued in the kernel, or read and not yet pushed.
    /// Lets the client tell "no telemetry came" from "the thread has not read it yet".
    pub fn pending(&self) -> bool {
        let (Some(sock), Some(_)) = (&self.sock, &self.thread) else {
            return false;
        };
        // The queue first, then the flag: a datagram taken off the queue after the
        // first look was taken by a thread that set `busy` before reading it.
        let queued = sys::queued_bytes(sock.as_fd());
        queued.map_or(true, |n| n > 0) || self.counters.busy.load(Ordering::SeqCst)
    }

    pub fn stats(&self) -> ReceiverStats {
        let c = &self.counters;
        ReceiverStats {
            received: c.received.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            rejected_uid: c.rejected_uid.load(Ordering::Relaxed),
            last_rejected_uid: match c.last_rejected_uid.load(Ordering::Relaxed) {
                NO_UID => None,
                uid => Some(uid as u32),
            },
            accepted_foreign: c.accepted_foreign.load(Ordering::Relaxed),
            oversized: c.oversized.load(Ordering::Relaxed),
            batches: c.batches.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            rcvbuf: self.rcvbuf,
        }
    }

    /// Stop the thread (after it has pushed what it already read), close the
    /// socket and unlink its path. Idempotent.
    pub fn close(&mut self) -> io::Result<()> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        if let Some(wake) = self.wake.take() {
            wake.wake();
        }
        let _ = thread.join();
        // The thread's references are gone with it: this closes the socket.
        self.sock = None;
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// One datagram's read outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Got {
    /// A datagram of `len` bytes from an admitted uid (`accepted`: an
    /// explicitly accepted one, not this process's own).
    Frame {
        len: usize,
        accepted: bool,
    },
    /// From a uid not admitted (None: no credentials).
    Foreign(Option<u32>),
    Oversized(usize),
}

/// Whether a datagram is admitted: from this process's euid `me` (read
/// once: the client never changes it) or an accepted uid, and no longer
/// than a frame may be.
fn classify(d: Datagram, me: u32, accept: &[u32]) -> Got {
    let accepted = match d.uid {
        Some(u) if u == me => false,
        Some(u) if accept.contains(&u) => true,
        other => return Got::Foreign(other),
    };
    if d.len > MAX_FRAME_BYTES {
        return Got::Oversized(d.len);
    }
    Got::Frame {
        len: d.len,
        accepted,
    }
}

/// How the thread spaces its reads.
#[derive(Clone, Copy, Debug)]
struct Pace {
    /// The longest pause after a read.
    max: Duration,
    /// How many datagrams the kernel queues before a sender has to wait.
    qlen: usize,
}

/// `net.unix.max_dgram_qlen` (what a socket made now queues), or the default.
fn queue_limit() -> usize {
    std::fs::read_to_string(QLEN_PATH)
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(DEFAULT_QLEN)
}

/// How long to let datagrams queue before the next read, after a read that
/// took `n` datagrams which arrived over `span` (since the previous read;
/// `paused`: that read followed a pause, not a wait for an arrival).
///
/// Every wake-up of the thread costs a context switch, on this kind of
/// machine about as much as handling the datagrams it brings (a wake-up
/// per 1-2 datagrams at 20k step records/s). Pausing lets several queue:
/// - after a wait for an arrival, only when it came within `max` of the
///   previous read (datagrams further apart than a pause: it would end
///   before the next one and only add a wake-up); after a pause, while it
///   brought something;
/// - no longer than half the kernel's queue takes to fill at the rate just
///   seen (measured over at most `max`: a conservative rate), so a sender
///   does not have to wait for room (it would wait, not lose the frame: the
///   emitter retries a full queue);
/// - never longer than `max` (what a frame's arrival may lag its read), and
///   not at all when that time is under [`MIN_PAUSE`].
fn next_pause(n: usize, span: Duration, paused: bool, pace: Pace) -> Duration {
    if n == 0 || pace.max.is_zero() || (!paused && span > pace.max) {
        return Duration::ZERO;
    }
    let half = (pace.qlen / 2).max(1) as u128;
    let fill = span.min(pace.max).as_nanos() * half / n as u128;
    let pause = Duration::from_nanos(fill.min(pace.max.as_nanos()) as u64);
    if pause < MIN_PAUSE {
        return Duration::ZERO;
    }
    pause
}

/// The thread's read buffers, reused from read to read.
struct Reads {
    bufs: Vec<Vec<u8>>,
    cbufs: Vec<CmsgBuf>,
    /// Each datagram of a batch (datagram i is in `bufs[i]`).
    got: Vec<Datagram>,
    /// The admitted ones as (i, length), in the order they were sent.
    frames: Vec<(usize, usize)>,
    oversized: Vec<usize>,
    /// recvmmsg (Linux 2.6.33) can still be refused (ENOSYS under some
    /// sandboxes): then one recvmsg per datagram, as before.
    batched: bool,
}

impl Reads {
    fn new() -> Reads {
        Reads {
            bufs: (0..BATCH).map(|_| vec![0u8; MAX_FRAME_BYTES + 1]).collect(),
            cbufs: vec![CmsgBuf::default(); BATCH],
            got: Vec::with_capacity(BATCH),
            frames: Vec::with_capacity(BATCH),
            oversized: Vec::new(),
            batched: true,
        }
    }
}

/// Read everything queued, a batch at a time, and push it; how many
/// datagrams were taken off the queue.
fn drain(
    r: &mut Reads,
    sock: &OwnedFd,
    sink: &Mutex<Fed>,
    counters: &ReceiverCounters,
    me: u32,
    accept: &[u32],
) -> usize {
    counters.busy.store(true, Ordering::SeqCst);
    let mut taken = 0;
    loop {
        r.got.clear();
        let mut again = false;
        if r.batched {
            loop {
                match sys::recv_many(sock.as_fd(), &mut r.bufs, &mut r.cbufs, &mut r.got) {
                    Ok(n) => again = n < BATCH,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => r.batched = false,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => again = true,
                    Err(_) => {
                        counters.errors.fetch_add(1, Ordering::Relaxed);
                        again = true;
                    }
                }
                break;
            }
        }
        if !r.batched {
            while r.got.len() < BATCH {
                let i = r.got.len();
                match sys::recv_one(sock.as_fd(), &mut r.bufs[i], &mut r.cbufs[i]) {
                    Ok(g) => r.got.push(g),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        again = true;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        counters.errors.fetch_add(1, Ordering::Relaxed);
                        again = true;
                        break;
                    }
                }
            }
        }
        taken += r.got.len();
        r.frames.clear();
        r.oversized.clear();
        for (i, &d) in r.got.iter().enumerate() {
            match classify(d, me, accept) {
                Got::Frame { len, accepted } => {
                    if accepted {
                        counters.accepted_foreign.fetch_add(1, Ordering::Relaxed);
                    }
                    r.frames.push((i, len));
                }
                Got::Oversized(n) => {
                    counters.oversized.fetch_add(1, Ordering::Relaxed);
                    r.oversized.push(n);
                }
                Got::Foreign(uid) => {
                    counters.rejected_uid.fetch_add(1, Ordering::Relaxed);
                    let uid = uid.map_or(NO_UID, u64::from);
                    counters.last_rejected_uid.store(uid, Ordering::Relaxed);
                }
            }
        }
        if !r.frames.is_empty() || !r.oversized.is_empty() {
            let total: usize = r.frames.iter().map(|&(_, n)| n).sum();
            let at = monotonic();
            if let Ok(mut fed) = sink.lock() {
                for &(i, n) in &r.frames {
                    fed.push_frame_at(&r.bufs[i][..n], at);
                }
                for &n in &r.oversized {
                    fed.reject_at(
                        format!("oversized frame: {n} bytes, limit {MAX_FRAME_BYTES}"),
                        at,
                    );
                }
            }
            counters
                .received
                .fetch_add(r.frames.len() as u64, Ordering::Relaxed);
            counters.bytes.fetch_add(total as u64, Ordering::Relaxed);
            counters.batches.fetch_add(1, Ordering::Relaxed);
        }
        if again {
            break;
        }
    }
    counters.busy.store(false, Ordering::SeqCst);
    taken
}

fn read_loop(
    sock: &OwnedFd,
    wake: &WakeReceiver,
    sink: &Mutex<Fed>,
    counters: &ReceiverCounters,
    me: u32,
    accept: &[u32],
    pace: Pace,
) {
    let mut reads = Reads::new();
    // After a read: how long to let datagrams queue before the next one
    // (zero: wait in poll for the next arrival), and when the last read that
    // brought datagrams ended.
    let mut pause = Duration::ZERO;
    let mut last_read = Instant::now();
    loop {
        counters.wakeups.fetch_add(1, Ordering::Relaxed);
        let stop = if pause.is_zero() {
            let mut fds = [
                libc::pollfd {
                    fd: sock.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: wake.fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            match sys::poll(&mut fds, -1) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    counters.errors.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
            fds[1].revents != 0
        } else {
            // The queue is read after the pause whatever it holds (nothing:
            // the next round waits in poll); a close ends the pause early.
            wake.sleep_unless_woken(pause)
        };
        // Read everything queued (also when stopping: what was sent before
        // close() is not lost).
        let n = drain(&mut reads, sock, sink, counters, me, accept);
        if stop {
            return;
        }
        let now = Instant::now();
        pause = next_pause(n, now - last_read, !pause.is_zero(), pace);
        if n > 0 {
            // Spans run from a read that brought datagrams (an empty one after a
            // pause must not make the next arrival look close to the last).
            last_read = now;
        }
    }
}

#[cfg(test)]
#[path = "receiver_tests.rs"]
mod tests;
