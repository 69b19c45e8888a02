//! The telemetry socket's thread against real datagrams: admission by
//! uid, batches, the pause between reads, close.

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
        std::fs::set_permissions(path.parent().unwrap(), PermissionsExt::from_mode(0o711)).unwrap();
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
                std::fs::set_permissions(path.parent().unwrap(), PermissionsExt::from_mode(0o711))
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
