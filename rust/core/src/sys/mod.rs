//! The system calls of the client's two reading threads (the HTTP thread,
//! [`crate::http`], and the telemetry socket's, [`crate::telemetry`]): the
//! wake pipe that interrupts a wait, `poll`/`ppoll`, the edge-triggered
//! epoll set (Linux) and the telemetry socket's datagram calls (Linux). Every
//! `unsafe` of those threads is here, each behind a safe function over
//! descriptors the caller owns ([`OwnedFd`]) or borrows.
//!
//! Why not `mio`: the telemetry socket needs what it does not wrap
//! (`SO_PASSCRED`, `SCM_CREDENTIALS` on every datagram, `recvmmsg`, `ppoll`),
//! so the FFI would stay; and the HTTP thread keeps a plain `poll` waiter
//! besides epoll (other Unixes, and the tests run both).

#[cfg(target_os = "linux")]
mod dgram;
#[cfg(target_os = "linux")]
mod epoll;

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

#[cfg(all(test, target_os = "linux"))]
pub(crate) use dgram::set_int_opt;
#[cfg(target_os = "linux")]
pub(crate) use dgram::{
    bind_datagrams, queued_bytes, receive_buffer, recv_many, recv_one, CmsgBuf, Datagram,
};
#[cfg(target_os = "linux")]
pub(crate) use epoll::Epoll;

/// A negative return as the OS error it stands for.
pub(crate) fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The effective uid of this process.
#[cfg(target_os = "linux")]
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid never fails.
    unsafe { libc::geteuid() }
}

/// The read end of a wake pipe: a waiting thread polls it besides its own
/// descriptors, and empties it when it fired.
pub(crate) struct WakeReceiver(OwnedFd);

/// The write end: one byte makes the other thread's wait return.
pub(crate) struct Waker(OwnedFd);

/// A non-blocking, close-on-exec pipe, as its two ends.
pub(crate) fn wake_pipe() -> io::Result<(WakeReceiver, Waker)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) })?;
    // SAFETY: both descriptors are new and owned by nothing else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((WakeReceiver(read), Waker(write)))
}

impl Waker {
    /// Wake the other end (a full pipe already means "wake up").
    pub(crate) fn wake(&self) {
        // SAFETY: one byte from a local into our own pipe.
        unsafe { libc::write(self.0.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
    }
}

impl WakeReceiver {
    pub(crate) fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Sleep `pause` unless the pipe is written first; whether it was.
    #[cfg(target_os = "linux")]
    pub(crate) fn sleep_unless_woken(&self, pause: std::time::Duration) -> bool {
        let mut fds = [libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let ts = libc::timespec {
            tv_sec: pause.as_secs() as libc::time_t,
            tv_nsec: pause.subsec_nanos() as libc::c_long,
        };
        // SAFETY: one valid pollfd and a valid timespec; no signal mask change.
        let r = unsafe { libc::ppoll(fds.as_mut_ptr(), 1, &ts, std::ptr::null()) };
        r > 0 && fds[0].revents != 0
    }

    /// Empty the pipe.
    pub(crate) fn drain(&self) {
        let mut drain = [0u8; 64];
        // SAFETY: reading our own non-blocking pipe into a local buffer.
        while unsafe { libc::read(self.fd(), drain.as_mut_ptr().cast(), drain.len()) } > 0 {}
    }
}

/// `poll(2)`: wait up to `timeout_ms` (-1: no limit) for an event on `fds`;
/// how many have one.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout_ms: libc::c_int) -> io::Result<usize> {
    // SAFETY: a valid array of pollfds of its length.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    cvt(r).map(|n| n as usize)
}
