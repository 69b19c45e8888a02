//! How the HTTP thread waits for its connections: one edge-triggered epoll
//! set on Linux, `poll` elsewhere (and in the tests that pick it).

use std::io;

use super::exchange::Exchange;
use crate::outcome::{EndKind, Outcome};
use crate::sys::{self, WakeReceiver};

/// The epoll token of the wake pipe (a connection's token is its descriptor).
#[cfg(target_os = "linux")]
const WAKE_TOKEN: u64 = u64::MAX;

/// How the thread waits for its connections.
pub(super) enum Waiter {
    /// `poll` over the wake pipe and every connection, each round.
    Poll(Vec<libc::pollfd>),
    /// One edge-triggered epoll set (Linux): a round costs the connections
    /// that changed, not all of them; readiness is kept on each exchange.
    #[cfg(target_os = "linux")]
    Edges {
        set: sys::Epoll,
        events: Vec<libc::epoll_event>,
        /// Exchange index by descriptor, for this round's events.
        slots: Vec<usize>,
        /// The last wait filled `events`: more may be queued.
        full: bool,
    },
}

fn fail_all(exchanges: &mut [Exchange], why: &str) {
    for ex in exchanges {
        ex.fail(Outcome::failed(EndKind::Io, why.to_owned()));
    }
}

impl Waiter {
    #[cfg_attr(not(target_os = "linux"), allow(unused_variables))]
    pub(super) fn new(wake: &WakeReceiver, edges: bool) -> Waiter {
        #[cfg(target_os = "linux")]
        if edges {
            let set = sys::Epoll::new();
            if let Ok(set) = set.and_then(|set| {
                set.add(wake.fd(), libc::EPOLLIN as u32, WAKE_TOKEN)
                    .map(|()| set)
            }) {
                return Waiter::Edges {
                    set,
                    events: vec![libc::epoll_event { events: 0, u64: 0 }; 128],
                    slots: Vec::new(),
                    full: false,
                };
            }
        }
        // No epoll (another Unix, or it failed): `poll` does the same job.
        Waiter::Poll(Vec::new())
    }

    /// Wait up to `wait_ms` (-1: no limit) and set `revents[i]` to the poll
    /// events exchange `i` has now.
    pub(super) fn wait(
        &mut self,
        wake: &WakeReceiver,
        exchanges: &mut [Exchange],
        wait_ms: libc::c_int,
        revents: &mut Vec<libc::c_short>,
    ) {
        revents.clear();
        match self {
            Waiter::Poll(fds) => {
                fds.clear();
                fds.push(libc::pollfd {
                    fd: wake.fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                fds.extend(exchanges.iter().map(|ex| libc::pollfd {
                    fd: ex.fd(),
                    events: ex.interest(),
                    revents: 0,
                }));
                match sys::poll(fds, wait_ms) {
                    Err(e) if e.kind() != io::ErrorKind::Interrupted => {
                        fail_all(exchanges, &format!("poll failed: {e}"));
                    }
                    _ => {}
                }
                if fds[0].revents != 0 {
                    wake.drain();
                }
                revents.extend(fds[1..].iter().map(|p| p.revents));
            }
            #[cfg(target_os = "linux")]
            Waiter::Edges {
                set,
                events,
                slots,
                full,
            } => {
                // A new socket joins the set; adding it reports what it already has.
                for ex in exchanges.iter_mut().filter(|ex| !ex.registered) {
                    let fd = ex.fd();
                    if fd < 0 {
                        continue;
                    }
                    let events =
                        (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32;
                    match set.add(fd, events, fd as u64) {
                        Ok(()) => ex.registered = true,
                        Err(e) => {
                            let why = format!("epoll_ctl failed: {e}");
                            ex.fail(Outcome::failed(EndKind::Io, why));
                        }
                    }
                }
                // Readiness kept from the last round (a capped read) means no sleep.
                let pending = *full || exchanges.iter().any(|ex| ex.ready_events() != 0);
                let n = match set.wait(events, if pending { 0 } else { wait_ms }) {
                    Ok(n) => n,
                    Err(e) => {
                        if e.kind() != io::ErrorKind::Interrupted {
                            fail_all(exchanges, &format!("epoll_wait failed: {e}"));
                        }
                        0
                    }
                };
                *full = n == events.len();
                for (i, ex) in exchanges.iter().enumerate() {
                    let fd = ex.fd();
                    if fd >= 0 && ex.registered {
                        let fd = fd as usize;
                        if slots.len() <= fd {
                            slots.resize(fd + 1, usize::MAX);
                        }
                        slots[fd] = i;
                    }
                }
                for ev in &events[..n] {
                    let (flags, token) = (ev.events, ev.u64);
                    if token == WAKE_TOKEN {
                        wake.drain();
                        continue;
                    }
                    let Some(&i) = slots.get(token as usize) else {
                        continue;
                    };
                    if let Some(ex) = exchanges.get_mut(i) {
                        let closing = (libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32;
                        let hangup = (libc::EPOLLHUP | libc::EPOLLERR) as u32;
                        ex.closing |= flags & closing != 0;
                        ex.readable |= flags & (libc::EPOLLIN as u32 | closing) != 0;
                        ex.writable |= flags & (libc::EPOLLOUT as u32 | hangup) != 0;
                    }
                }
                slots.fill(usize::MAX);
                revents.extend(exchanges.iter().map(Exchange::ready_events));
            }
        }
    }
}
