//! The SSE reading thread (Unix): the client's streaming connections, read
//! and parsed without Python.
//!
//! The client sends each request and reads the response head in Python
//! (httpx), then hands a duplicate of the connection's descriptor to this
//! thread. The thread polls every connection, reads what arrived, runs it
//! through [`StreamBody`] (HTTP framing, SSE, chunk JSON), pushes each delta
//! into the run's [`Reconciler`] exactly as `push_sse` would, and queues what
//! the screen model needs. Python collects the queue a few dozen times a
//! second with [`SseReader::take`]. A read costs no Python at all, where a
//! Python reader paid an interpreter wake-up per network read.
//!
//! With several connections open, rounds that read something are at least
//! `min_interval` apart: each read then brings several chunks, and the
//! thread's wake-ups stay bounded whatever the token rate. Arrival times are
//! then exact to `min_interval`.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::http::Framing;
use crate::reconcile::Reconciler;
use crate::sse::Usage;
use crate::sse_stream::{StreamBody, StreamEnd};

/// Bytes read by one `recv`.
const READ_BYTES: usize = 256 * 1024;
/// Reads of one connection per round before the others get their turn.
const READS_PER_ROUND: usize = 4;
/// Open connections from which the thread waits out `min_interval` between
/// two rounds that read something.
pub const COALESCE_STREAMS: usize = 4;
/// The client's `min_interval`: below an engine step of a GPU server at 64
/// streams, and what arrival times are exact to while rounds are spaced.
pub const DEFAULT_MIN_INTERVAL: Duration = Duration::from_millis(5);

/// `CLOCK_MONOTONIC` in seconds: the clock of Python's `time.monotonic()`.
pub fn monotonic() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// New deltas of one stream since the last `take`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StreamRead {
    /// The non-empty texts, in order.
    pub texts: Vec<String>,
    /// One arrival time per delta ([`monotonic`] at its read).
    pub times: Vec<f64>,
    pub tokens: usize,
    /// UTF-8 bytes of the texts.
    pub bytes: usize,
}

/// Why a stream stopped being read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadEnd {
    /// The body ended (see [`StreamEnd`]).
    Body(StreamEnd),
    /// No byte for the stream's read timeout.
    Timeout,
    /// Reading the connection failed (not a close).
    Io(String),
}

/// A stream whose reading is over; its deltas were all pushed and queued
/// before this was.
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    pub stream: u16,
    pub end: ReadEnd,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
}

enum Command {
    Add {
        stream: u16,
        fd: libc::c_int,
        framing: Framing,
        initial: Vec<u8>,
        timeout: Option<Duration>,
    },
    Remove {
        stream: u16,
    },
}

#[derive(Default)]
struct Shared {
    commands: Vec<Command>,
    reads: Vec<(u16, StreamRead)>,
    /// Where each stream's entry is in `reads`: rounds between two `take`s
    /// add to one entry per stream.
    read_index: std::collections::HashMap<u16, usize>,
    finished: Vec<Finished>,
}

/// One delta as read: what the reconciler and the screen model both need.
struct Delta {
    text: String,
    ids: Vec<u32>,
    /// [`monotonic`] at its read.
    time: f64,
}

struct Conn {
    stream: u16,
    /// -1 once closed (or when handed over already closed).
    fd: libc::c_int,
    body: StreamBody,
    last_read: Instant,
    timeout: Option<Duration>,
    /// Deltas read this round, not yet published.
    deltas: Vec<Delta>,
    end: Option<ReadEnd>,
}

impl Conn {
    fn close_fd(&mut self) {
        if self.fd >= 0 {
            // SAFETY: we own this descriptor.
            unsafe { libc::close(self.fd) };
            self.fd = -1;
        }
    }

    /// Bytes from the connection, or `None` when it closed.
    fn advance(&mut self, data: Option<&[u8]>, time: f64) {
        let deltas = &mut self.deltas;
        let mut on_delta = |text: &str, ids: &[u32]| {
            deltas.push(Delta {
                text: text.to_owned(),
                ids: ids.to_vec(),
                time,
            })
        };
        match data {
            Some(data) => self.body.feed(data, &mut on_delta),
            None => self.body.finish(&mut on_delta),
        }
        if self.end.is_none() {
            if let Some(end) = &self.body.end {
                self.end = Some(ReadEnd::Body(end.clone()));
            }
        }
    }
}

impl StreamRead {
    fn push(&mut self, delta: Delta) {
        self.times.push(delta.time);
        self.tokens += delta.ids.len();
        self.bytes += delta.text.len();
        if !delta.text.is_empty() {
            self.texts.push(delta.text);
        }
    }
}

/// The reading thread and its queue.
pub struct SseReader {
    shared: Arc<Mutex<Shared>>,
    wake: libc::c_int,
    stop: Arc<AtomicBool>,
    /// Set when the thread ended by a panic: nothing it held will finish.
    failed: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl SseReader {
    /// Start the thread. Deltas go into `sink` when given (None: chunk mode).
    pub fn start(
        sink: Option<Arc<Mutex<Reconciler>>>,
        min_interval: Duration,
    ) -> io::Result<SseReader> {
        let mut pipe = [0 as libc::c_int; 2];
        // SAFETY: pipe2 writes two descriptors into the array.
        cvt(unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) })?;
        let (wake_r, wake_w) = (pipe[0], pipe[1]);
        let shared = Arc::new(Mutex::new(Shared::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(AtomicBool::new(false));
        let (t_shared, t_stop, t_failed) =
            (Arc::clone(&shared), Arc::clone(&stop), Arc::clone(&failed));
        let spawned = std::thread::Builder::new()
            .name("parallelhue-sse".into())
            .spawn(move || {
                let run = std::panic::AssertUnwindSafe(|| {
                    read_loop(wake_r, &t_shared, &t_stop, sink.as_deref(), min_interval)
                });
                if std::panic::catch_unwind(run).is_err() {
                    t_failed.store(true, Ordering::SeqCst);
                }
                // SAFETY: the thread owns the pipe's read end.
                unsafe { libc::close(wake_r) };
            });
        match spawned {
            Ok(thread) => Ok(SseReader {
                shared,
                wake: wake_w,
                stop,
                failed,
                thread: Some(thread),
            }),
            Err(e) => {
                // SAFETY: closing the pipe we just made.
                unsafe {
                    libc::close(wake_r);
                    libc::close(wake_w);
                }
                Err(e)
            }
        }
    }

    fn command(&self, command: Command) {
        if let Ok(mut s) = self.shared.lock() {
            s.commands.push(command);
        }
        // SAFETY: one byte into our pipe; a full pipe already means "wake up".
        unsafe { libc::write(self.wake, [1u8].as_ptr().cast(), 1) };
    }

    /// Read stream `stream` from `fd` (owned from now on: closed when the
    /// stream ends or is removed; -1 for a connection that already closed).
    /// `initial` holds body bytes read with the response head.
    pub fn add(
        &self,
        stream: u16,
        fd: libc::c_int,
        framing: Framing,
        initial: Vec<u8>,
        timeout: Option<Duration>,
    ) {
        if self.thread.is_none() {
            if fd >= 0 {
                // SAFETY: the caller gave us this descriptor.
                unsafe { libc::close(fd) };
            }
            return;
        }
        self.command(Command::Add {
            stream,
            fd,
            framing,
            initial,
            timeout,
        });
    }

    /// Stop reading `stream` and close its descriptor (no `Finished` for it).
    pub fn remove(&self, stream: u16) {
        self.command(Command::Remove { stream });
    }

    /// What happened since the last call: new deltas per stream (in order),
    /// then the streams that finished.
    pub fn take(&self) -> (Vec<(u16, StreamRead)>, Vec<Finished>) {
        match self.shared.lock() {
            Ok(mut s) => {
                s.read_index.clear();
                (
                    std::mem::take(&mut s.reads),
                    std::mem::take(&mut s.finished),
                )
            }
            Err(_) => (Vec::new(), Vec::new()),
        }
    }

    pub fn is_closed(&self) -> bool {
        self.thread.is_none()
    }

    /// The thread died (a bug): the streams it held will never finish.
    pub fn has_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Stop the thread and close every descriptor it holds. Idempotent.
    pub fn close(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.stop.store(true, Ordering::SeqCst);
        // SAFETY: one byte into our pipe.
        unsafe { libc::write(self.wake, [1u8].as_ptr().cast(), 1) };
        let _ = thread.join();
        // SAFETY: closing our write end, once.
        unsafe { libc::close(self.wake) };
        // Descriptors handed over after the thread stopped.
        if let Ok(mut s) = self.shared.lock() {
            for command in s.commands.drain(..) {
                if let Command::Add { fd, .. } = command {
                    if fd >= 0 {
                        // SAFETY: owned since `add`.
                        unsafe { libc::close(fd) };
                    }
                }
            }
        }
    }
}

impl Drop for SseReader {
    fn drop(&mut self) {
        self.close();
    }
}

fn read_loop(
    wake: libc::c_int,
    shared: &Mutex<Shared>,
    stop: &AtomicBool,
    sink: Option<&Mutex<Reconciler>>,
    min_interval: Duration,
) {
    let mut conns: Vec<Conn> = Vec::new();
    let mut buf = vec![0u8; READ_BYTES];
    let mut pollfds: Vec<libc::pollfd> = Vec::new();
    let mut drain = [0u8; 64];
    loop {
        let round_start = Instant::now();
        // Wait for data, a command, or the nearest read timeout.
        pollfds.clear();
        pollfds.push(libc::pollfd {
            fd: wake,
            events: libc::POLLIN,
            revents: 0,
        });
        for c in &conns {
            pollfds.push(libc::pollfd {
                fd: c.fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let wait_ms = conns
            .iter()
            .filter_map(|c| {
                c.timeout
                    .map(|t| (c.last_read + t).saturating_duration_since(round_start))
            })
            .min()
            .map_or(-1, |d| {
                d.as_millis().min(i32::MAX as u128) as libc::c_int + 1
            });
        // SAFETY: a valid array of pollfds.
        let r = unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as libc::nfds_t, wait_ms) };
        if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            for c in &mut conns {
                c.end = Some(ReadEnd::Io(format!(
                    "poll failed: {}",
                    io::Error::last_os_error()
                )));
            }
        }
        if pollfds[0].revents != 0 {
            // SAFETY: reading our own non-blocking pipe.
            while unsafe { libc::read(wake, drain.as_mut_ptr().cast(), drain.len()) } > 0 {}
        }
        let now = monotonic();
        let instant = Instant::now();
        let mut ready = 0;
        for (i, c) in conns.iter_mut().enumerate() {
            if pollfds[i + 1].revents == 0 || c.end.is_some() {
                continue;
            }
            ready += 1;
            read_conn(c, &mut buf, now, instant);
        }
        // Commands after the reads: a removed stream's last bytes are dropped anyway.
        let commands = match shared.lock() {
            Ok(mut s) => std::mem::take(&mut s.commands),
            Err(_) => Vec::new(),
        };
        let mut removed: Vec<u16> = Vec::new();
        for command in commands {
            match command {
                Command::Add {
                    stream,
                    fd,
                    framing,
                    initial,
                    timeout,
                } => {
                    let mut c = Conn {
                        stream,
                        fd,
                        body: StreamBody::new(framing),
                        last_read: instant,
                        timeout,
                        deltas: Vec::new(),
                        end: None,
                    };
                    if !initial.is_empty() {
                        c.advance(Some(&initial), now);
                    }
                    if c.fd < 0 && c.end.is_none() {
                        c.advance(None, now);
                    } else if c.end.is_none() {
                        // Whatever came after the head arrived before the hand-over.
                        read_conn(&mut c, &mut buf, now, instant);
                    }
                    conns.push(c);
                }
                Command::Remove { stream } => removed.push(stream),
            }
        }
        for c in &mut conns {
            if c.end.is_none() {
                if let Some(t) = c.timeout {
                    if instant.duration_since(c.last_read) >= t {
                        c.end = Some(ReadEnd::Timeout);
                    }
                }
            }
        }
        publish(&mut conns, &removed, shared, sink);
        if stop.load(Ordering::SeqCst) {
            for c in &mut conns {
                c.close_fd();
            }
            return;
        }
        // Coalesce when many streams are open: the next round's reads then
        // bring several chunks each, and an engine step's burst of 64 chunks
        // is read in one or two rounds instead of one round per chunk. A
        // run of a few streams keeps per-read arrival times.
        let spent = round_start.elapsed();
        if ready > 0 && conns.len() >= COALESCE_STREAMS && spent < min_interval {
            std::thread::sleep(min_interval - spent);
        }
    }
}

/// Read what `c`'s connection holds (a few reads at most per round).
fn read_conn(c: &mut Conn, buf: &mut [u8], now: f64, instant: Instant) {
    for _ in 0..READS_PER_ROUND {
        if c.fd < 0 || c.end.is_some() {
            return;
        }
        // SAFETY: a valid buffer; the descriptor is ours.
        let n = unsafe { libc::recv(c.fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n > 0 {
            c.last_read = instant;
            c.advance(Some(&buf[..n as usize]), now);
            if (n as usize) < buf.len() {
                return; // drained
            }
            continue;
        }
        if n == 0 {
            c.advance(None, now);
            return;
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => return,
            io::ErrorKind::Interrupted => continue,
            // A reset is a close: the body decides whether it was complete.
            io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => {
                c.advance(None, now);
                return;
            }
            _ => {
                c.end = Some(ReadEnd::Io(e.to_string()));
                return;
            }
        }
    }
}

/// Push the round's deltas into the reconciler (one lock), then queue them
/// and the finished streams for Python (one lock).
fn publish(
    conns: &mut Vec<Conn>,
    removed: &[u16],
    shared: &Mutex<Shared>,
    sink: Option<&Mutex<Reconciler>>,
) {
    let any = conns.iter().any(|c| !c.deltas.is_empty());
    if any {
        if let Some(sink) = sink {
            if let Ok(mut r) = sink.lock() {
                for c in conns.iter().filter(|c| !removed.contains(&c.stream)) {
                    for d in &c.deltas {
                        r.push_sse(c.stream, &d.text, &d.ids);
                    }
                }
            }
        }
    }
    let Ok(mut s) = shared.lock() else {
        return;
    };
    let s = &mut *s;
    for c in conns.iter_mut() {
        let deltas = std::mem::take(&mut c.deltas);
        if removed.contains(&c.stream) {
            c.close_fd();
            continue;
        }
        if !deltas.is_empty() {
            let i = *s.read_index.entry(c.stream).or_insert_with(|| {
                s.reads.push((c.stream, StreamRead::default()));
                s.reads.len() - 1
            });
            for d in deltas {
                s.reads[i].1.push(d);
            }
        }
        if let Some(end) = c.end.clone() {
            c.close_fd();
            s.finished.push(Finished {
                stream: c.stream,
                end,
                finish_reason: c.body.finish_reason.clone(),
                usage: c.body.usage.clone(),
            });
        }
    }
    conns.retain(|c| c.end.is_none() && !removed.contains(&c.stream));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::IntoRawFd;
    use std::os::unix::net::UnixStream;

    fn wait_finished(reader: &SseReader, n: usize) -> (Vec<(u16, StreamRead)>, Vec<Finished>) {
        let (mut reads, mut finished) = (Vec::new(), Vec::new());
        let deadline = Instant::now() + Duration::from_secs(10);
        while finished.len() < n && Instant::now() < deadline {
            let (r, f) = reader.take();
            reads.extend(r);
            finished.extend(f);
            std::thread::sleep(Duration::from_millis(2));
        }
        (reads, finished)
    }

    const A: &str = "data: {\"choices\":[{\"index\":0,\"text\":\"h\u{e9}\",\"token_ids\":[5,6],\"finish_reason\":null}]}\n\n";
    const B: &str = "data: {\"choices\":[{\"index\":0,\"text\":\"!\",\"token_ids\":[7],\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";

    #[test]
    fn reads_streams_into_the_reconciler_and_the_queue() {
        let rec = Arc::new(Mutex::new(Reconciler::with_run_id([1; 16], 2)));
        let mut reader =
            SseReader::start(Some(Arc::clone(&rec)), Duration::from_millis(1)).unwrap();
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        theirs.set_nonblocking(true).unwrap();
        reader.add(
            1,
            theirs.into_raw_fd(),
            Framing::Close,
            A.as_bytes()[..10].to_vec(),
            None,
        );
        ours.write_all(&A.as_bytes()[10..]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        ours.write_all(B.as_bytes()).unwrap();
        // Two reads in separate rounds, then takes: each take holds at most
        // one entry per stream, however many rounds it covers.
        std::thread::sleep(Duration::from_millis(300));
        let (mut reads, mut finished) = (Vec::new(), Vec::new());
        let deadline = Instant::now() + Duration::from_secs(10);
        while finished.is_empty() && Instant::now() < deadline {
            let (r, f) = reader.take();
            assert!(r.len() <= 1, "{r:?}");
            reads.extend(r);
            finished.extend(f);
            std::thread::sleep(Duration::from_millis(2));
        }
        let texts: Vec<String> = reads.iter().flat_map(|(_, r)| r.texts.clone()).collect();
        assert_eq!(texts, vec!["h\u{e9}", "!"]);
        let tokens: usize = reads.iter().map(|(_, r)| r.tokens).sum();
        assert_eq!(tokens, 3);
        assert!(reads.iter().all(|(s, _)| *s == 1));
        assert_eq!(finished[0].end, ReadEnd::Body(StreamEnd::Done));
        assert_eq!(finished[0].finish_reason.as_deref(), Some("stop"));
        // The reconciler holds what a twin fed by push_sse holds.
        let mut twin = Reconciler::with_run_id([1; 16], 2);
        twin.push_sse(1, "h\u{e9}", &[5, 6]);
        twin.push_sse(1, "!", &[7]);
        assert_ne!(twin.retained(), (0, 0));
        assert_eq!(rec.lock().unwrap().retained(), twin.retained());
        reader.close();
        assert!(reader.is_closed());
    }

    #[test]
    fn close_mid_body_timeout_and_remove() {
        let mut reader = SseReader::start(None, Duration::ZERO).unwrap();
        // Chunked body cut short by the close.
        let (mut a, a_theirs) = UnixStream::pair().unwrap();
        reader.add(
            0,
            a_theirs.into_raw_fd(),
            Framing::Chunked,
            Vec::new(),
            None,
        );
        a.write_all(b"5\r\nda").unwrap();
        drop(a);
        // Silent connection with a read timeout.
        let (_b, b_theirs) = UnixStream::pair().unwrap();
        let timeout = Some(Duration::from_millis(50));
        reader.add(
            1,
            b_theirs.into_raw_fd(),
            Framing::Close,
            Vec::new(),
            timeout,
        );
        // Removed before it ends: no Finished for it.
        let (_c, c_theirs) = UnixStream::pair().unwrap();
        reader.add(2, c_theirs.into_raw_fd(), Framing::Close, Vec::new(), None);
        reader.remove(2);
        // Already closed when handed over: the initial bytes are the whole body.
        reader.add(3, -1, Framing::Close, B.as_bytes().to_vec(), None);
        let (_, mut finished) = wait_finished(&reader, 3);
        finished.sort_by_key(|f| f.stream);
        let ends: Vec<(u16, ReadEnd)> = finished.into_iter().map(|f| (f.stream, f.end)).collect();
        assert_eq!(
            ends,
            vec![
                (
                    0,
                    ReadEnd::Body(StreamEnd::Framing(crate::http::BodyError::Incomplete {
                        framing: "chunked"
                    }))
                ),
                (1, ReadEnd::Timeout),
                (3, ReadEnd::Body(StreamEnd::Done)),
            ]
        );
        std::thread::sleep(Duration::from_millis(20));
        assert!(reader.take().1.is_empty());
        reader.close();
    }
}
