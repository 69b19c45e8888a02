//! One epoll set (Linux).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::cvt;

/// An epoll set, closed when dropped.
pub(crate) struct Epoll(OwnedFd);

impl Epoll {
    pub(crate) fn new() -> io::Result<Epoll> {
        // SAFETY: a plain syscall; the descriptor it returns is ours alone.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: as above.
        Ok(Epoll(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Add `fd` with `events`; the wait reports it with `token`.
    pub(crate) fn add(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: `ev` outlives the call; a bad `fd` is an error, not UB.
        cvt(unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) })
            .map(|_| ())
    }

    /// Wait up to `timeout_ms` (-1: no limit, 0: not at all); how many of
    /// `events` were filled.
    pub(crate) fn wait(
        &self,
        events: &mut [libc::epoll_event],
        timeout_ms: libc::c_int,
    ) -> io::Result<usize> {
        // SAFETY: `events` is a valid array of its length.
        let r = unsafe {
            libc::epoll_wait(
                self.0.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as libc::c_int,
                timeout_ms,
            )
        };
        cvt(r).map(|n| n as usize)
    }
}
