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

/// A point-in-time copy of the counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    pub received: u64,
    pub bytes: u64,
    pub rejected_uid: u64,
    /// The uid of the last datagram rejected for its uid (None: none, or no credentials).
    pub last_rejected_uid: Option<u32>,
    pub accepted_foreign: u64,
    pub oversized: u64,
    pub batches: u64,
    pub errors: u64,
    /// The socket's receive buffer as the kernel reports it.
    pub rcvbuf: u64,
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
mod tests {
    use super::*;
    use crate::encode::{HelloFields, Sender};
    use crate::reconcile::Reconciler;
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixDatagram;

    fn tmp_path(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ph-recv-{}-{name}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        dir.join("r.sock")
    }

    #[test]
    fn frames_reach_the_reconciler_and_close_unlinks() {
        let path = tmp_path("basic");
        let _ = std::fs::remove_file(&path);
        let run = [3u8; 16];
        let rec = Arc::new(Mutex::new(Fed::new(Reconciler::with_run_id(run, 2))));
        let mut rx = Receiver::bind(&path, 1 << 20, Arc::clone(&rec), &[]).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let tx = UnixDatagram::unbound().unwrap();
        let mut s = Sender::new(run, 9);
        tx.send_to(&s.hello(&HelloFields::simulated(1, 2)), &path)
            .unwrap();
        tx.send_to(b"garbage", &path).unwrap();
        rx.close().unwrap();
        assert!(!path.exists());
        let st = rx.stats();
        assert_eq!((st.received, st.rejected_uid), (2, 0));
        assert!(st.rcvbuf > 0);
        let r = rec.lock().unwrap();
        assert_eq!(r.sources().len(), 1);
        assert_eq!(r.counters().rejected_frames, 1);
        assert_eq!(r.counters().frames, 2);
    }

    #[test]
    fn pending_covers_every_datagram_sent_before_it() {
        // The client asks `pending` once its streams ended: while it says true a
        // datagram already sent may still be on its way; once false, all of them
        // are in the reconciler (no sleeping in between).
        let path = tmp_path("pending");
        let _ = std::fs::remove_file(&path);
        let run = [5u8; 16];
        let rec = Arc::new(Mutex::new(Fed::new(Reconciler::with_run_id(run, 1))));
        let mut rx = Receiver::bind(&path, 1 << 20, Arc::clone(&rec), &[]).unwrap();
        let tx = UnixDatagram::unbound().unwrap();
        for round in 1..=50u64 {
            tx.send_to(b"not a frame", &path).unwrap();
            while rx.pending() {
                std::thread::yield_now();
            }
            assert_eq!(rec.lock().unwrap().counters().frames, round);
        }
        rx.close().unwrap();
        assert!(!rx.pending());
    }

    #[test]
    fn existing_path_is_an_error() {
        let path = tmp_path("exists");
        std::fs::write(&path, b"x").unwrap();
        let rec = Arc::new(Mutex::new(Fed::new(Reconciler::with_run_id([0; 16], 1))));
        let e = Receiver::bind(&path, 0, rec, &[]).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn long_path_is_an_error_naming_the_limit() {
        let path = PathBuf::from(format!("/tmp/{}", "x".repeat(120)));
        let rec = Arc::new(Mutex::new(Fed::new(Reconciler::with_run_id([0; 16], 1))));
        let e = Receiver::bind(&path, 0, rec, &[]).err().unwrap();
        assert!(e.to_string().contains("107 usable bytes"), "{e}");
    }

    /// Send `data` to `path` from a forked child running as uid/gid 65534;
    /// whether the send succeeded.
    fn send_as_nobody(path: &Path, data: &[u8]) -> bool {
        let target = CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: the child only makes async-signal-safe syscalls, then _exit.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                let ok = libc::setresgid(65534, 65534, 65534) == 0
                    && libc::setresuid(65534, 65534, 65534) == 0;
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM, 0);
                let mut addr: libc::sockaddr_un = std::mem::zeroed();
                addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
                for (d, s) in addr.sun_path.iter_mut().zip(target.as_bytes()) {
                    *d = *s as libc::c_char;
                }
                let sent = libc::sendto(
                    fd,
                    data.as_ptr().cast(),
                    data.len(),
                    0,
                    (&addr as *const libc::sockaddr_un).cast(),
                    std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
                );
                libc::_exit(if ok && sent >= 0 { 0 } else { 1 });
            }
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
        }
    }

    #[test]
    fn another_uid_is_admitted_only_when_accepted_and_counted() {
        if sys::euid() != 0 {
            eprintln!("skipped: dropping to uid 65534 needs root");
            return;
        }
        let run = [4u8; 16];
        let hello = Sender::new(run, 5).hello(&HelloFields::simulated(1, 2));
        let case = |name: &str, accept: &[u32]| {
            let path = tmp_path(name);
            let _ = std::fs::remove_file(&path);
            std::fs::set_permissions(path.parent().unwrap(), PermissionsExt::from_mode(0o711))
                .unwrap();
            let rec = Arc::new(Mutex::new(Fed::new(Reconciler::with_run_id(run, 1))));
            let mut rx = Receiver::bind(&path, 1 << 16, Arc::clone(&rec), accept).unwrap();
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            let sent = send_as_nobody(&path, &hello);
            rx.close().unwrap();
            let frames = rec.lock().unwrap().counters().frames;
            (mode, sent, rx.stats(), frames)
        };
        // Default: the socket is 0600, uid 65534 cannot even send.
        let (mode, sent, st, frames) = case("nobody-default", &[]);
        assert_eq!((mode, sent, st.received, frames), (0o600, false, 0, 0));
        // Another uid accepted: 0622, and 65534's datagram is still rejected, by uid.
        let (mode, sent, st, frames) = case("nobody-other", &[12345]);
        assert_eq!((mode, sent, frames), (0o622, true, 0));
        assert_eq!((st.rejected_uid, st.last_rejected_uid), (1, Some(65534)));
        // 65534 accepted: admitted and counted as such.
        let (mode, sent, st, frames) = case("nobody-accepted", &[65534]);
        assert_eq!((mode, sent, frames), (0o622, true, 1));
        assert_eq!(
            (st.received, st.accepted_foreign, st.rejected_uid),
            (1, 1, 0)
        );
        // Our own uid in the list changes nothing: 0600, nothing counted as foreign.
        let (mode, _, st, _) = case("root-accepted", &[0]);
        assert_eq!((mode, st.accepted_foreign), (0o600, 0));
    }

    /// A socket set up as `bind` sets it up (credentials passed, non-blocking),
    /// without the reading thread, and a sender.
    fn bare_socket(name: &str) -> (PathBuf, UnixDatagram, UnixDatagram) {
        let path = tmp_path(name);
        let _ = std::fs::remove_file(&path);
        let rx = UnixDatagram::bind(&path).unwrap();
        rx.set_nonblocking(true).unwrap();
        sys::set_int_opt(rx.as_fd(), libc::SO_PASSCRED, 1).unwrap();
        sys::set_int_opt(rx.as_fd(), libc::SO_RCVBUF, 1 << 20).unwrap();
        (path, rx, UnixDatagram::unbound().unwrap())
    }

    /// Send a mix of frames, oversized datagrams and (as root) another
    /// uid's datagrams; what reading them back gives, one `recvmsg` at a
    /// time or `per_call` at a time with `recvmmsg`, with each frame's bytes.
    fn read_back(name: &str, per_call: Option<usize>) -> Vec<(Got, Vec<u8>)> {
        let (path, rx, tx) = bare_socket(name);
        let root = sys::euid() == 0;
        let mut sent = 0;
        // At most 10 queued: net.unix.max_dgram_qlen is 10 here, and nothing reads yet.
        for i in 0..9u8 {
            match i % 4 {
                1 => tx.send_to(&vec![i; MAX_FRAME_BYTES + 1 + i as usize], &path),
                3 if root => {
                    std::fs::set_permissions(&path, PermissionsExt::from_mode(0o622)).unwrap();
                    std::fs::set_permissions(
                        path.parent().unwrap(),
                        PermissionsExt::from_mode(0o711),
                    )
                    .unwrap();
                    assert!(send_as_nobody(&path, &[i; 7]));
                    Ok(7)
                }
                _ => tx.send_to(&vec![i; 1 + i as usize], &path),
            }
            .unwrap();
            sent += 1;
        }
        let fd = rx.as_fd();
        let me = sys::euid();
        let mut bufs: Vec<Vec<u8>> = (0..5).map(|_| vec![0u8; MAX_FRAME_BYTES + 1]).collect();
        let mut cbufs = vec![CmsgBuf::default(); 5];
        let mut out = Vec::new();
        loop {
            let mut got = Vec::new();
            let n = match per_call {
                Some(k) => match sys::recv_many(fd, &mut bufs[..k], &mut cbufs[..k], &mut got) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                    Err(e) => panic!("{e}"),
                },
                None => match sys::recv_one(fd, &mut bufs[0], &mut cbufs[0]) {
                    Ok(d) => {
                        got.push(d);
                        1
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                    Err(e) => panic!("{e}"),
                },
            };
            for (i, d) in got.into_iter().enumerate() {
                let g = classify(d, me, &[]);
                let bytes = match g {
                    Got::Frame { len, .. } => bufs[i][..len].to_vec(),
                    _ => Vec::new(),
                };
                out.push((g, bytes));
            }
            if n < per_call.unwrap_or(1) {
                break;
            }
        }
        assert_eq!(out.len(), sent);
        let _ = std::fs::remove_file(&path);
        out
    }

    #[test]
    fn batched_reads_check_every_datagram_as_single_reads_do() {
        let root = sys::euid() == 0;
        let one = read_back("single", None);
        let expected: Vec<(Got, Vec<u8>)> = (0..9u8)
            .map(|i| match i % 4 {
                1 => (Got::Oversized(MAX_FRAME_BYTES + 1 + i as usize), Vec::new()),
                3 if root => (Got::Foreign(Some(65534)), Vec::new()),
                _ => (
                    Got::Frame {
                        len: 1 + i as usize,
                        accepted: false,
                    },
                    vec![i; 1 + i as usize],
                ),
            })
            .collect();
        assert_eq!(one, expected);
        // Whole batches, a short last batch, and one datagram per call.
        for per_call in [5, 4, 1] {
            assert_eq!(
                read_back(&format!("many{per_call}"), Some(per_call)),
                expected
            );
        }
    }

    #[test]
    fn more_datagrams_than_a_batch_all_arrive() {
        let path = tmp_path("overbatch");
        let _ = std::fs::remove_file(&path);
        let rec = Arc::new(Mutex::new(Fed::new(Reconciler::with_run_id([6; 16], 1))));
        let mut rx = Receiver::bind(&path, 1 << 22, Arc::clone(&rec), &[]).unwrap();
        let tx = UnixDatagram::unbound().unwrap();
        let count = 3 * BATCH as u64 + 7;
        for _ in 0..count {
            tx.send_to(b"not a frame", &path).unwrap();
        }
        rx.close().unwrap();
        assert_eq!(rx.stats().received, count);
        let r = rec.lock().unwrap();
        assert_eq!(r.counters().frames, count);
        assert_eq!(r.counters().rejected_frames, count);
    }

    fn ms(x: f64) -> Duration {
        Duration::from_secs_f64(x / 1e3)
    }

    #[test]
    fn a_pause_lets_at_most_half_the_queue_fill_and_never_exceeds_the_limit() {
        let pace = Pace {
            max: ms(10.0),
            qlen: 10,
        };
        // Nothing read, or pausing turned off: wait in poll as before.
        assert_eq!(next_pause(0, ms(5.0), false, pace), Duration::ZERO);
        assert_eq!(next_pause(0, ms(5.0), true, pace), Duration::ZERO);
        let off = Pace {
            max: Duration::ZERO,
            ..pace
        };
        assert_eq!(next_pause(8, ms(5.0), false, off), Duration::ZERO);
        // Arrivals further apart than a pause (a burst of 3 per 12.8 ms engine
        // step, 5k step records/s): no pause, one wake-up per burst as before.
        assert_eq!(next_pause(1, ms(30.0), false, pace), Duration::ZERO);
        assert_eq!(next_pause(3, ms(12.8), false, pace), Duration::ZERO);
        assert_eq!(
            next_pause(10, Duration::from_secs(2), false, pace),
            Duration::ZERO
        );
        // A datagram 5 ms after the last: the full pause (two or so per wake-up).
        assert_eq!(next_pause(1, ms(5.0), false, pace), ms(10.0));
        // The bench's rate (~620 datagrams/s): 5 queue in the 8 ms it pauses.
        assert_eq!(next_pause(5, ms(8.0), true, pace), ms(8.0));
        // Fast: 10 in 2 ms, so half the queue fills in 1 ms (the shortest pause).
        assert_eq!(next_pause(10, ms(2.0), false, pace), ms(1.0));
        // Faster (or a burst read while it was still arriving): no pause.
        assert_eq!(next_pause(10, ms(1.9), false, pace), Duration::ZERO);
        assert_eq!(next_pause(1, ms(0.1), false, pace), Duration::ZERO);
        // After a pause (its span is the pause and the read): 10 over 12 ms,
        // the fill timed over at most `max` (10 ms): 5 ms.
        assert_eq!(next_pause(10, ms(12.0), true, pace), ms(5.0));
        assert_eq!(next_pause(2, ms(10.5), true, pace), ms(10.0));
        // Everywhere: never above the limit; where it pauses, the rate just seen
        // (over the measured span, at most `max`) fills at most half the queue.
        for qlen in [1, 2, 10, 64] {
            let pace = Pace { qlen, ..pace };
            for n in 1..=130usize {
                for tenths in 1..=600u32 {
                    let span = ms(f64::from(tenths) / 10.0);
                    for paused in [false, true] {
                        let p = next_pause(n, span, paused, pace);
                        assert!(p <= pace.max, "{n} {span:?} {p:?}");
                        assert!(p.is_zero() || p >= MIN_PAUSE, "{n} {span:?} {p:?}");
                        if !paused && span > pace.max {
                            assert_eq!(p, Duration::ZERO);
                        }
                        if !p.is_zero() {
                            let rate = n as f64 / span.min(pace.max).as_secs_f64();
                            let queued = rate * p.as_secs_f64();
                            let half = (qlen / 2).max(1) as f64;
                            assert!(queued <= half + 1e-6, "{n} {span:?} {p:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn queue_limit_is_the_kernels() {
        let limit = queue_limit();
        match std::fs::read_to_string(QLEN_PATH) {
            Ok(s) => assert_eq!(limit, s.trim().parse::<usize>().unwrap()),
            Err(_) => assert_eq!(limit, DEFAULT_QLEN),
        }
    }

    /// Send `count` datagrams, `burst` at a time every `gap`, close, and
    /// return (frames, batches, wake-ups).
    fn paced_send(
        name: &str,
        max_pause: Duration,
        count: u64,
        burst: u64,
        gap: Duration,
    ) -> (u64, u64, u64) {
        let path = tmp_path(name);
        let _ = std::fs::remove_file(&path);
        let rec = Arc::new(Mutex::new(Fed::new(Reconciler::with_run_id([8; 16], 1))));
        let mut rx = Receiver::bind_with(&path, 1 << 20, Arc::clone(&rec), &[], max_pause).unwrap();
        let tx = UnixDatagram::unbound().unwrap();
        let start = Instant::now();
        for i in 0..count {
            // Blocking sends: a full queue makes the sender wait, never lose one.
            tx.send_to(b"not a frame", &path).unwrap();
            if (i + 1) % burst == 0 {
                let due = start + gap * ((i + 1) / burst) as u32;
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
        }
        rx.close().unwrap();
        let st = rx.stats();
        let frames = rec.lock().unwrap().counters().frames;
        assert_eq!(st.received, count);
        (
            frames,
            st.batches,
            rx.counters.wakeups.load(Ordering::Relaxed),
        )
    }

    #[test]
    fn a_steady_stream_of_datagrams_is_read_in_fewer_wakeups_and_all_arrive() {
        // 400 datagrams at ~2,000/s: pausing reads several per wake-up (about 5:
        // half the kernel's queue of 10); without pauses each arrival is a
        // wake-up of its own unless the machine is slow.
        let (frames, batches, wakeups) = paced_send("paced", DEFAULT_MAX_PAUSE, 400, 1, ms(0.5));
        assert_eq!(frames, 400);
        assert!(batches <= 400 / 2, "{batches} batches for 400 datagrams");
        assert!(wakeups <= 400 / 2, "{wakeups} wake-ups for 400 datagrams");
        // Pausing off: the same datagrams, all there.
        let (frames, _, _) = paced_send("unpaced", Duration::ZERO, 400, 1, ms(0.5));
        assert_eq!(frames, 400);
    }

    #[test]
    fn bursts_further_apart_than_a_pause_cost_no_extra_wakeup() {
        // 3 datagrams every 15 ms (a slower engine): a pause would end before
        // the next burst and read nothing. Every wait but the last (the close)
        // must bring datagrams; how many waits a burst takes (the thread may
        // wake before its sender's third send) is the scheduler's.
        let (frames, batches, wakeups) = paced_send("bursts", DEFAULT_MAX_PAUSE, 90, 3, ms(15.0));
        assert_eq!(frames, 90);
        assert!(
            wakeups <= batches + 3,
            "{wakeups} waits, {batches} with datagrams"
        );
    }

    #[test]
    fn close_during_a_pause_returns_promptly_with_everything_read() {
        let path = tmp_path("closepause");
        let _ = std::fs::remove_file(&path);
        let rec = Arc::new(Mutex::new(Fed::new(Reconciler::with_run_id([9; 16], 1))));
        // Pauses of up to 5 s: one datagram 1 s after the start is read, then the
        // thread pauses 5 s (half a queue of 10 at one datagram a second, capped).
        let mut rx = Receiver::bind_with(
            &path,
            1 << 20,
            Arc::clone(&rec),
            &[],
            Duration::from_secs(5),
        )
        .unwrap();
        let tx = UnixDatagram::unbound().unwrap();
        std::thread::sleep(Duration::from_secs(1));
        tx.send_to(b"not a frame", &path).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while rx.stats().received < 1 && Instant::now() < deadline {
            std::thread::sleep(ms(1.0));
        }
        for _ in 0..3 {
            tx.send_to(b"not a frame", &path).unwrap();
        }
        std::thread::sleep(ms(50.0));
        assert_eq!(rx.stats().received, 1, "read during the pause");
        assert!(rx.pending(), "queued datagrams are pending during a pause");
        // A close that waited the pause out would take about 5 s.
        let started = Instant::now();
        rx.close().unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(rx.stats().received, 4);
        assert_eq!(rec.lock().unwrap().counters().frames, 4);
    }
}
