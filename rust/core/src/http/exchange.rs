//! One stream's connection on the HTTP thread: connect (each resolved
//! address in turn), TLS, write the request, read what comes, the timeouts.
//! What the bytes read mean is `response.rs`.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Instant;

use rustls::ClientConnection;
use socket2::{Domain, Protocol, Socket, Type};

use super::response::Response;
use super::{Target, Timeouts};
use crate::outcome::{EndKind, Outcome};

/// Reads of one connection per round before the others get their turn.
const READS_PER_ROUND: usize = 4;
pub(super) enum Phase {
    Connecting,
    /// Connected: writing the request, reading the answer.
    Talking,
}

pub(super) struct Exchange {
    pub(super) stream: u16,
    pub(super) phase: Phase,
    pub(super) sock: Option<TcpStream>,
    pub(super) tls: Option<ClientConnection>,
    pub(super) addrs: Vec<SocketAddr>,
    pub(super) next_addr: usize,
    pub(super) request: Vec<u8>,
    /// Plain connections: request bytes written so far.
    pub(super) sent: usize,
    /// The write side is done (or the server closed it).
    pub(super) sent_all: bool,
    /// What the server answered so far.
    pub(super) response: Response,
    pub(super) started: Instant,
    pub(super) last_progress: Instant,
    /// Monotonic time of the start, published with the first round.
    pub(super) start_at: Option<f64>,
    pub(super) end: Option<Outcome>,
    /// Its end was handed to the run: the exchange is dropped.
    pub(super) done: bool,
    /// Edge-triggered readiness ([`super::waiter::Waiter::Edges`]): set by an event, kept
    /// until a read or write meets `EAGAIN` (a plain read also on a short
    /// read), so a read cut by the per-round cap, or a TLS read that stops
    /// before `EAGAIN`, goes on in the next round without a new event.
    pub(super) readable: bool,
    pub(super) writable: bool,
    /// An event said the peer closed (or the socket failed): a short read no
    /// longer means drained, the end is still to be read and no event follows.
    pub(super) closing: bool,
    /// The current socket is in the epoll set.
    pub(super) registered: bool,
}

/// What reading a connection gave.
pub(super) enum Got {
    Data(usize),
    Eof,
    Again,
}

pub(super) fn strerror(e: &io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error ") {
        Some(i) => text[..i].to_owned(),
        None => text,
    }
}

impl Exchange {
    pub(super) fn new(stream: u16, request: Vec<u8>, now: Instant, at: f64) -> Exchange {
        Exchange {
            stream,
            phase: Phase::Connecting,
            sock: None,
            tls: None,
            addrs: Vec::new(),
            next_addr: 0,
            request,
            sent: 0,
            sent_all: false,
            response: Response::new(),
            started: now,
            last_progress: now,
            start_at: Some(at),
            end: None,
            done: false,
            readable: false,
            writable: false,
            closing: false,
            registered: false,
        }
    }

    pub(super) fn fail(&mut self, outcome: Outcome) {
        if self.end.is_none() {
            self.end = Some(outcome);
        }
        self.sock = None;
        self.tls = None;
    }

    pub(super) fn fd(&self) -> libc::c_int {
        self.sock.as_ref().map_or(-1, |s| s.as_raw_fd())
    }

    /// Poll events this exchange waits for.
    pub(super) fn interest(&self) -> libc::c_short {
        match self.phase {
            Phase::Connecting => libc::POLLOUT,
            Phase::Talking => {
                let wants_write = match &self.tls {
                    Some(tls) => tls.wants_write(),
                    None => !self.sent_all,
                };
                libc::POLLIN | if wants_write { libc::POLLOUT } else { 0 }
            }
        }
    }

    /// Poll events this exchange has, by its edge-triggered readiness.
    pub(super) fn ready_events(&self) -> libc::c_short {
        if self.end.is_some() || self.sock.is_none() {
            return 0;
        }
        let mut events = 0;
        if self.writable {
            events |= self.interest() & libc::POLLOUT;
        }
        if self.readable && matches!(self.phase, Phase::Talking) {
            events |= libc::POLLIN;
        }
        events
    }

    /// Connect to the next address; a failure of the last one ends the stream.
    pub(super) fn connect_next(&mut self, target: &Target, mut last: Option<io::Error>) {
        while self.next_addr < self.addrs.len() {
            let addr = self.addrs[self.next_addr];
            self.next_addr += 1;
            let attempt = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
                .and_then(|s| s.set_nonblocking(true).map(|()| s))
                .and_then(|s| match s.connect(&addr.into()) {
                    Ok(()) => Ok(s),
                    Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(s),
                    Err(e) => Err(e),
                });
            match attempt {
                Ok(s) => {
                    self.sock = Some(s.into());
                    self.phase = Phase::Connecting;
                    (self.registered, self.readable, self.writable, self.closing) =
                        (false, false, false, false);
                    return;
                }
                Err(e) => last = Some(e),
            }
        }
        let outcome = match last {
            Some(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                Outcome::failed(EndKind::Refused, target.shown.clone())
            }
            Some(e) => Outcome::failed(
                EndKind::ConnectFailed,
                format!("{}: {}", target.shown, strerror(&e)),
            ),
            None => Outcome::failed(
                EndKind::ConnectFailed,
                format!("{}: no address to connect to", target.shown),
            ),
        };
        self.fail(outcome);
    }

    /// The socket became writable (or failed) while connecting.
    fn on_connected(&mut self, target: &Target, now: Instant) {
        let Some(sock) = &self.sock else { return };
        let error = match sock.take_error() {
            Ok(Some(e)) => Some(e),
            Ok(None) => sock.peer_addr().err(),
            Err(e) => Some(e),
        };
        if let Some(e) = error {
            self.sock = None;
            return self.connect_next(target, Some(e));
        }
        let _ = sock.set_nodelay(true);
        self.phase = Phase::Talking;
        self.last_progress = now;
        if target.tls {
            match super::tls::connect(&target.host) {
                Ok(mut tls) => {
                    // rustls holds the request until the handshake is done.
                    let _ = tls.writer().write_all(&self.request);
                    self.request = Vec::new();
                    self.tls = Some(tls);
                }
                Err(e) => self.fail(Outcome::failed(
                    EndKind::Tls,
                    format!("{}: {e}", target.shown),
                )),
            }
        }
    }

    fn tls_error(&mut self, target: &Target, e: impl std::fmt::Display) {
        self.fail(Outcome::failed(
            EndKind::Tls,
            format!("{}: {e}", target.shown),
        ));
    }

    /// Write what can be written.
    fn write_some(&mut self, target: &Target, now: Instant) {
        let Some(sock) = &mut self.sock else { return };
        if let Some(tls) = &mut self.tls {
            while tls.wants_write() {
                match tls.write_tls(sock) {
                    Ok(_) => self.last_progress = now,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.writable = false;
                        return;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        return self.tls_error(target, strerror(&e));
                    }
                }
            }
            self.sent_all = !tls.is_handshaking();
            return;
        }
        while self.sent < self.request.len() {
            match sock.write(&self.request[self.sent..]) {
                Ok(n) => {
                    self.sent += n;
                    self.last_progress = now;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.writable = false;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // The server closed its side: what it answered is still read.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                    ) =>
                {
                    break;
                }
                Err(e) => return self.fail(Outcome::failed(EndKind::Io, strerror(&e))),
            }
        }
        self.sent_all = true;
        self.request = Vec::new();
    }

    /// Read plaintext into `buf`.
    fn read_some(&mut self, target: &Target, buf: &mut [u8]) -> Got {
        let Some(sock) = &mut self.sock else {
            return Got::Eof;
        };
        let Some(tls) = &mut self.tls else {
            return loop {
                match sock.read(buf) {
                    Ok(0) => break Got::Eof,
                    Ok(n) => {
                        // A short read took all the socket held (but its end).
                        self.readable &= n == buf.len() || self.closing;
                        break Got::Data(n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.readable = false;
                        break Got::Again;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    // A reset is a close: the body decides whether it was complete.
                    Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break Got::Eof,
                    Err(e) => {
                        self.fail(Outcome::failed(EndKind::Io, strerror(&e)));
                        break Got::Again;
                    }
                }
            };
        };
        // Plaintext already decrypted comes first.
        match tls.reader().read(buf) {
            Ok(0) => return Got::Eof,
            Ok(n) => return Got::Data(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Got::Eof,
            Err(e) => {
                self.tls_error(target, e);
                return Got::Again;
            }
        }
        let closed = loop {
            match tls.read_tls(sock) {
                Ok(0) => break true,
                Ok(_) => break false,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.readable = false;
                    return Got::Again;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break true,
                Err(e) => {
                    self.fail(Outcome::failed(EndKind::Io, strerror(&e)));
                    return Got::Again;
                }
            }
        };
        if let Err(e) = tls.process_new_packets() {
            // Let the peer know why, if the socket still takes it.
            let _ = tls.write_tls(sock);
            self.tls_error(target, e);
            return Got::Again;
        }
        match tls.reader().read(buf) {
            Ok(0) => Got::Eof,
            Ok(n) => Got::Data(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if closed {
                    Got::Eof
                } else {
                    Got::Again
                }
            }
            // Closed without close_notify: an HTTP body knows its own end.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Got::Eof,
            Err(e) => {
                self.tls_error(target, e);
                Got::Again
            }
        }
    }

    /// One round's work on this exchange.
    pub(super) fn drive(
        &mut self,
        target: &Target,
        revents: libc::c_short,
        buf: &mut [u8],
        time: f64,
        now: Instant,
    ) {
        if self.end.is_some() {
            return;
        }
        if let Phase::Connecting = self.phase {
            if revents & (libc::POLLOUT | libc::POLLERR | libc::POLLHUP) == 0 {
                return;
            }
            self.on_connected(target, now);
            if self.end.is_some() || matches!(self.phase, Phase::Connecting) {
                return;
            }
        }
        self.write_some(target, now);
        for _ in 0..READS_PER_ROUND {
            if self.end.is_some() {
                return;
            }
            match self.read_some(target, buf) {
                Got::Data(n) => {
                    self.last_progress = now;
                    if let Some(end) = self.response.on_bytes(Some(&buf[..n]), time) {
                        self.fail(end);
                    }
                    if self.tls.as_ref().is_some_and(|t| t.wants_write()) {
                        self.write_some(target, now);
                    }
                    if self.tls.is_none() && n < buf.len() {
                        return; // drained
                    }
                }
                Got::Eof => {
                    let end = self.response.on_bytes(None, time);
                    self.fail(end.unwrap_or_else(|| Outcome::failed(EndKind::Closed, "")));
                    return;
                }
                Got::Again => return,
            }
        }
    }

    /// When this exchange's current timeout expires, and what it means.
    pub(super) fn deadline(&self, t: &Timeouts) -> Option<(Instant, Outcome)> {
        let handshaking = self.tls.as_ref().is_some_and(|c| c.is_handshaking());
        if matches!(self.phase, Phase::Connecting) || handshaking {
            return Some((
                self.started + t.connect,
                Outcome::failed(EndKind::ConnectTimeout, ""),
            ));
        }
        if !self.sent_all {
            return Some((
                self.last_progress + t.write,
                Outcome::failed(
                    EndKind::Io,
                    format!(
                        "writing the request stalled for {} s",
                        t.write.as_secs_f64()
                    ),
                ),
            ));
        }
        t.read.map(|r| {
            (
                self.last_progress + r,
                Outcome::failed(EndKind::ReadTimeout, ""),
            )
        })
    }
}
