//! The HTTP thread (Unix): every stream's whole exchange, without Python.
//!
//! One thread polls every stream's connection and drives each through its
//! exchange: connect (with the connect timeout; each resolved address in
//! turn), TLS for `https://` ([`super::tls`]), write the request Python
//! composed, read the response head ([`crate::http::Head`]), then either the
//! error body (status >= 400), a refusal (not `text/event-stream`, or a
//! compressed body), or the SSE body ([`StreamBody`]: HTTP framing, SSE
//! events, chunk JSON). Every delta goes into the run's [`Fed`] — recorded,
//! reconciled, queued for the screen — and the thread finishes each stream
//! itself: a normal end with its finish reason, any other end as an
//! [`Outcome`] the client's one mapper turns into the user's message.
//!
//! The same thread also reads the run's HTTP telemetry stream when the run
//! subscribes to it ([`HttpStreams::subscribe`], docs/PROTOCOL.md "HTTP
//! telemetry stream"): one more exchange, whose body is decoded by
//! [`TelemetryBody`]. Its preamble names the run the server created; the
//! frames are held until the client accepts that run
//! ([`HttpStreams::accept_telemetry`]: the reconciler takes the server's run
//! id, the recording has begun), then each goes into the run's [`Fed`]
//! exactly like a datagram from the telemetry socket.
//!
//! With several connections open, rounds that read something are at least
//! `min_interval` apart: each read then brings several chunks, and the
//! thread's wake-ups stay bounded whatever the token rate (arrival times are
//! then exact to `min_interval`). One stream's failure — a panic included —
//! ends that stream only.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustls::ClientConnection;
use socket2::{Domain, Protocol, Socket, Type};

use crate::fed::{monotonic, Ended, Fed};
use crate::http::{find_head_end, BodyDecoder, BodyError, Framing, Head, MAX_HEAD_BYTES};
use crate::outcome::{EndKind, Outcome};
use crate::sse_inputs::{SseInput, SseInputRef};
use crate::sse_stream::{StreamBody, StreamEnd};
use crate::sys::{self, WakeReceiver, Waker};
use crate::telemetry::stream::{BodyEnd, Preamble, StreamItem, TelemetryBody};

/// Bytes read by one `recv`.
const READ_BYTES: usize = 256 * 1024;
/// Reads of one connection per round before the others get their turn.
const READS_PER_ROUND: usize = 4;
/// The start of an error body kept for the message.
pub const ERROR_BODY_LIMIT: usize = 4096;
/// Open connections from which the thread waits out `min_interval` between
/// two rounds that read something.
pub const COALESCE_STREAMS: usize = 4;
/// The client's `min_interval`: below an engine step of a GPU server at 64
/// streams, and what arrival times are exact to while rounds are spaced.
/// 10 ms rather than 5: half the reads (each `recv` and the TCP
/// acknowledgement it causes cost about as much as parsing the chunks it
/// brings; docs/benchmarks/client.md measures both side by side).
pub const DEFAULT_MIN_INTERVAL: Duration = Duration::from_millis(10);
/// The content type of a telemetry stream response.
pub const TELEMETRY_CONTENT_TYPE: &str = "application/x-parallelhue-telemetry";
/// The shortest silence after which an open telemetry stream counts as lost,
/// whatever the read timeout: five of the hub's 2 s heartbeats.
pub const TELEMETRY_MIN_SILENCE: Duration = Duration::from_secs(10);
/// The stream number of the telemetry exchange (never a stream: the
/// reconciler allows at most 65 535 streams, numbered from 0).
const TELEMETRY: u16 = u16::MAX;

/// Where the streams go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub tls: bool,
    /// How messages name the server (`host` or `host:port`, as the user wrote it).
    pub shown: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP connect and TLS handshake.
    pub connect: Duration,
    /// The longest silence while waiting for the response; None: no limit.
    pub read: Option<Duration>,
    /// The longest stall while writing the request.
    pub write: Duration,
}

enum Command {
    Add {
        stream: u16,
        request: Vec<u8>,
        at: f64,
    },
    /// End the stream with this outcome (cancelled, or failed by the client).
    Stop { stream: u16, outcome: Outcome },
    /// Create the run's telemetry stream on the server (`POST`).
    Subscribe { request: Vec<u8> },
    /// The client took the server's run id: frames go to the run from now on.
    AcceptTelemetry,
}

/// How the telemetry stream ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TelemetryEnd {
    /// The exchange failed before a telemetry body, or its connection did
    /// (refused, TLS, an HTTP status, another content type, a timeout, a reset).
    Exchange(Outcome),
    /// The body ended: the server's end item, or its framing broke.
    Body(BodyEnd),
}

/// The telemetry stream of a run, as the HTTP thread has seen it so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TelemetryState {
    pub subscribed: bool,
    /// The stream's preamble: the run the server created for this client.
    pub preamble: Option<Preamble>,
    /// The client took the run: frames go into the run's reconciler.
    pub accepted: bool,
    /// Frame items handed to the reconciler, and their bytes.
    pub frames: u64,
    pub bytes: u64,
    /// Frames the server's hub discarded for this client (sum of `dropped` items).
    pub dropped: u64,
    pub heartbeats: u64,
    /// Set once, when the stream is over (None while it is open, and when
    /// the client closed it at the end of the run).
    pub end: Option<TelemetryEnd>,
}

#[derive(Default)]
struct Shared {
    commands: Vec<Command>,
}

/// One SSE input of a stream read in this round, with its arrival time.
struct Delta {
    input: Pending,
    time: f64,
}

/// A delta's text and token ids are copied into the exchange's round
/// buffers (reused every round: no allocation per chunk); the rare other
/// inputs are kept as they are.
enum Pending {
    Delta {
        text: Range<usize>,
        token_ids: Range<usize>,
    },
    Other(SseInput),
}

/// The SSE inputs of one exchange read since the last publish.
#[derive(Default)]
struct RoundInputs {
    deltas: Vec<Delta>,
    text: String,
    token_ids: Vec<u32>,
}

impl RoundInputs {
    fn push(&mut self, input: SseInputRef<'_>, time: f64) {
        let input = match input {
            SseInputRef::Delta { text, token_ids } => {
                let t = self.text.len();
                let i = self.token_ids.len();
                self.text.push_str(text);
                self.token_ids.extend_from_slice(token_ids);
                Pending::Delta {
                    text: t..self.text.len(),
                    token_ids: i..self.token_ids.len(),
                }
            }
            other => Pending::Other(other.to_owned()),
        };
        self.deltas.push(Delta { input, time });
    }

    fn is_empty(&self) -> bool {
        self.deltas.is_empty()
    }

    /// Hand them to `fed` in order, and empty the buffers (keeping them).
    fn publish(&mut self, fed: &mut Fed, stream: u16) {
        for d in self.deltas.drain(..) {
            match d.input {
                Pending::Delta { text, token_ids } => {
                    fed.sse_delta(stream, &self.text[text], &self.token_ids[token_ids], d.time)
                }
                Pending::Other(input) => fed.sse_input(stream, &input, d.time),
            }
        }
        self.text.clear();
        self.token_ids.clear();
    }
}

/// The error body of a status >= 400 being read.
struct ErrorBody {
    status: u16,
    decoder: BodyDecoder,
    bytes: Vec<u8>,
}

enum Phase {
    Connecting,
    /// Connected: writing the request, reading the answer.
    Talking,
}

struct Exchange {
    stream: u16,
    /// The run's telemetry stream rather than a completion stream.
    telemetry: bool,
    phase: Phase,
    sock: Option<TcpStream>,
    tls: Option<ClientConnection>,
    addrs: Vec<SocketAddr>,
    next_addr: usize,
    request: Vec<u8>,
    /// Plain connections: request bytes written so far.
    sent: usize,
    /// The write side is done (or the server closed it).
    sent_all: bool,
    head: Vec<u8>,
    error_body: Option<ErrorBody>,
    body: Option<StreamBody>,
    tbody: Option<TelemetryBody>,
    /// Telemetry items decoded since the last publish.
    items: Vec<StreamItem>,
    started: Instant,
    last_progress: Instant,
    /// Monotonic time of the start, published with the first round.
    start_at: Option<f64>,
    deltas: RoundInputs,
    end: Option<Outcome>,
    /// Its end was handed to the run: the exchange is dropped.
    done: bool,
    /// Edge-triggered readiness ([`Waiter::Edges`]): set by an event, kept
    /// until a read or write meets `EAGAIN` (a plain read also on a short
    /// read), so a read cut by the per-round cap, or a TLS read that stops
    /// before `EAGAIN`, goes on in the next round without a new event.
    readable: bool,
    writable: bool,
    /// An event said the peer closed (or the socket failed): a short read no
    /// longer means drained, the end is still to be read and no event follows.
    closing: bool,
    /// The current socket is in the epoll set.
    registered: bool,
}

/// What reading a connection gave.
enum Got {
    Data(usize),
    Eof,
    Again,
}

fn strerror(e: &io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error ") {
        Some(i) => text[..i].to_owned(),
        None => text,
    }
}

impl Exchange {
    fn new(stream: u16, request: Vec<u8>, now: Instant, at: f64) -> Exchange {
        Exchange {
            stream,
            telemetry: stream == TELEMETRY,
            phase: Phase::Connecting,
            sock: None,
            tls: None,
            addrs: Vec::new(),
            next_addr: 0,
            request,
            sent: 0,
            sent_all: false,
            head: Vec::new(),
            error_body: None,
            body: None,
            tbody: None,
            items: Vec::new(),
            started: now,
            last_progress: now,
            start_at: Some(at),
            deltas: RoundInputs::default(),
            end: None,
            done: false,
            readable: false,
            writable: false,
            closing: false,
            registered: false,
        }
    }

    fn fail(&mut self, outcome: Outcome) {
        if self.end.is_none() {
            self.end = Some(outcome);
        }
        self.sock = None;
        self.tls = None;
    }

    fn fd(&self) -> libc::c_int {
        self.sock.as_ref().map_or(-1, |s| s.as_raw_fd())
    }

    /// Poll events this exchange waits for.
    fn interest(&self) -> libc::c_short {
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
    fn ready_events(&self) -> libc::c_short {
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
    fn connect_next(&mut self, target: &Target, mut last: Option<io::Error>) {
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

    fn push_body(&mut self, data: Option<&[u8]>, time: f64) {
        let Some(body) = &mut self.body else { return };
        let deltas = &mut self.deltas;
        let mut on_delta = |input: SseInputRef<'_>| deltas.push(input, time);
        match data {
            Some(d) => body.feed_ref(d, &mut on_delta),
            None => body.finish_ref(&mut on_delta),
        }
        let outcome = match &body.end {
            None => return,
            Some(StreamEnd::Done | StreamEnd::BodyEnded) if body.finish_reason.is_some() => {
                Outcome::finished()
            }
            Some(StreamEnd::Done | StreamEnd::BodyEnded) => Outcome::failed(EndKind::NoFinish, ""),
            Some(StreamEnd::BadEvent(m)) => Outcome::failed(EndKind::BadSse, m.clone()),
            Some(StreamEnd::Framing(BodyError::Incomplete { .. })) => {
                Outcome::failed(EndKind::Closed, "")
            }
            Some(StreamEnd::Framing(e)) => Outcome::failed(EndKind::Framing, e.to_string()),
        };
        self.fail(outcome);
    }

    fn push_telemetry(&mut self, data: Option<&[u8]>) {
        let Some(body) = &mut self.tbody else { return };
        match data {
            Some(d) => body.feed(d, &mut self.items),
            None => body.finish(),
        }
        if body.end.is_some() {
            // Its end is the body's (kept there); the outcome only closes the exchange.
            self.fail(Outcome::finished());
        }
    }

    fn push_error_body(&mut self, data: Option<&[u8]>) {
        let Some(eb) = &mut self.error_body else {
            return;
        };
        let done = match data {
            Some(d) => {
                let mut out = Vec::new();
                let result = eb.decoder.feed(d, &mut out);
                let room = ERROR_BODY_LIMIT - eb.bytes.len();
                eb.bytes.extend_from_slice(&out[..out.len().min(room)]);
                result.is_err() || eb.decoder.is_complete() || eb.bytes.len() >= ERROR_BODY_LIMIT
            }
            None => true,
        };
        if done {
            let outcome = Outcome::http(
                EndKind::HttpStatus,
                eb.status,
                String::from_utf8_lossy(&eb.bytes).into_owned(),
            );
            self.fail(outcome);
        }
    }

    /// Response bytes before the head was complete.
    fn push_head(&mut self, data: &[u8], time: f64) {
        self.head.extend_from_slice(data);
        loop {
            let Some((end, sep)) = find_head_end(&self.head) else {
                if self.head.len() > MAX_HEAD_BYTES {
                    self.fail(Outcome::failed(
                        EndKind::Protocol,
                        format!("response head longer than {MAX_HEAD_BYTES} bytes"),
                    ));
                }
                return;
            };
            let head = match Head::parse(&self.head[..end]) {
                Ok(h) => h,
                Err(e) => return self.fail(Outcome::failed(EndKind::Protocol, e.0)),
            };
            let rest = self.head.split_off(end + sep);
            self.head.clear();
            if head.is_interim() {
                self.head = rest;
                continue; // 100 Continue, 103 Early Hints
            }
            let framing = match head.framing("POST") {
                Ok(f) => f,
                Err(e) => return self.fail(Outcome::failed(EndKind::Protocol, e.0)),
            };
            if head.status >= 400 {
                self.error_body = Some(ErrorBody {
                    status: head.status,
                    decoder: BodyDecoder::new(framing),
                    bytes: Vec::new(),
                });
                if framing == Framing::Length(0) {
                    return self.push_error_body(None);
                }
                if !rest.is_empty() {
                    self.push_error_body(Some(&rest));
                }
                return;
            }
            let content_type = head.get("content-type").unwrap_or_default();
            if self.telemetry {
                let media = content_type.split(';').next().unwrap_or("").trim();
                if !media.eq_ignore_ascii_case(TELEMETRY_CONTENT_TYPE) {
                    return self.fail(Outcome::http(EndKind::NotSse, head.status, content_type));
                }
            } else if !content_type
                .to_ascii_lowercase()
                .contains("text/event-stream")
            {
                return self.fail(Outcome::http(EndKind::NotSse, head.status, content_type));
            }
            let encoding = head.get("content-encoding").unwrap_or_default();
            let coding = encoding.trim().to_ascii_lowercase();
            if !coding.is_empty() && coding != "identity" {
                return self.fail(Outcome::failed(EndKind::Encoding, encoding));
            }
            if self.telemetry {
                self.tbody = Some(TelemetryBody::new(framing));
                if framing == Framing::Length(0) {
                    return self.push_telemetry(None);
                }
                if !rest.is_empty() {
                    self.push_telemetry(Some(&rest));
                }
                return;
            }
            self.body = Some(StreamBody::new(framing));
            if framing == Framing::Length(0) {
                return self.push_body(None, time);
            }
            if !rest.is_empty() {
                self.push_body(Some(&rest), time);
            }
            return;
        }
    }

    fn on_bytes(&mut self, data: Option<&[u8]>, time: f64) {
        if self.tbody.is_some() {
            self.push_telemetry(data);
        } else if self.body.is_some() {
            self.push_body(data, time);
        } else if self.error_body.is_some() {
            self.push_error_body(data);
        } else {
            match data {
                Some(d) => self.push_head(d, time),
                None => self.fail(Outcome::failed(EndKind::NoResponse, "")),
            }
        }
    }

    /// One round's work on this exchange.
    fn drive(
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
                    self.on_bytes(Some(&buf[..n]), time);
                    if self.tls.as_ref().is_some_and(|t| t.wants_write()) {
                        self.write_some(target, now);
                    }
                    if self.tls.is_none() && n < buf.len() {
                        return; // drained
                    }
                }
                Got::Eof => {
                    self.on_bytes(None, time);
                    if self.end.is_none() {
                        self.fail(Outcome::failed(EndKind::Closed, ""));
                    }
                    return;
                }
                Got::Again => return,
            }
        }
    }

    /// When this exchange's current timeout expires, and what it means.
    fn deadline(&self, t: &Timeouts) -> Option<(Instant, Outcome)> {
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
        let read = if self.telemetry {
            // Heartbeats keep an open telemetry stream busy.
            t.read.map(|r| r.max(TELEMETRY_MIN_SILENCE))
        } else {
            t.read
        };
        read.map(|r| {
            (
                self.last_progress + r,
                Outcome::failed(EndKind::ReadTimeout, ""),
            )
        })
    }
}

/// The HTTP thread of a run.
pub struct HttpStreams {
    shared: Arc<Mutex<Shared>>,
    telemetry: Arc<Mutex<TelemetryState>>,
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
        let telemetry = Arc::new(Mutex::new(TelemetryState::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(AtomicBool::new(false));
        let (t_shared, t_stop, t_failed) =
            (Arc::clone(&shared), Arc::clone(&stop), Arc::clone(&failed));
        let t_telemetry = Arc::clone(&telemetry);
        let spawned = std::thread::Builder::new()
            .name("parallelhue-http".into())
            .spawn(move || {
                let mut thread = Thread {
                    wake: &wake_r,
                    shared: &t_shared,
                    stop: &t_stop,
                    fed: &fed,
                    telemetry: &t_telemetry,
                    link: Link::default(),
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
            telemetry,
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

    /// Create the run's telemetry stream: `request` is the whole `POST` of
    /// the server's runs route. At most one per run; a second is refused.
    pub fn subscribe(&self, request: Vec<u8>) -> Result<(), &'static str> {
        {
            let mut t = self
                .telemetry
                .lock()
                .map_err(|_| "telemetry state poisoned")?;
            if t.subscribed {
                return Err("this run already has a telemetry stream");
            }
            t.subscribed = true;
        }
        self.command(Command::Subscribe { request });
        Ok(())
    }

    /// Take the run the server created (its preamble arrived): the run's
    /// reconciler gets the server's run id, and every frame from now on
    /// (those already read included, in order) goes into it.
    pub fn accept_telemetry(&self) {
        self.command(Command::AcceptTelemetry);
    }

    /// The telemetry stream so far.
    pub fn telemetry(&self) -> TelemetryState {
        self.telemetry.lock().map(|t| t.clone()).unwrap_or_default()
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

/// The telemetry stream's items on their way into the run.
#[derive(Default)]
struct Link {
    /// Items read but not yet handed to the run (held until it is accepted).
    items: Vec<StreamItem>,
    /// The stream ended; handed to the state once the items before it are.
    end: Option<TelemetryEnd>,
    accept: bool,
    /// The run's reconciler was told that the stream ended early.
    end_told: bool,
}

struct Thread<'a> {
    wake: &'a WakeReceiver,
    shared: &'a Mutex<Shared>,
    stop: &'a AtomicBool,
    fed: &'a Mutex<Fed>,
    telemetry: &'a Mutex<TelemetryState>,
    link: Link,
    target: Target,
    timeouts: Timeouts,
    min_interval: Duration,
    /// The target's addresses, looked up once (or why the lookup failed).
    addrs: Option<Result<Vec<SocketAddr>, String>>,
    options: ReadOptions,
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

/// The epoll token of the wake pipe (a connection's token is its descriptor).
#[cfg(target_os = "linux")]
const WAKE_TOKEN: u64 = u64::MAX;

/// How the thread waits for its connections.
enum Waiter {
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
    fn new(wake: &WakeReceiver, edges: bool) -> Waiter {
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
    fn wait(
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

    fn run(&mut self) {
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
                    Command::Subscribe { request } => {
                        let at = monotonic();
                        let ex = self.start_exchange(TELEMETRY, request, now, at);
                        exchanges.push(ex);
                    }
                    Command::AcceptTelemetry => self.link.accept = true,
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

    /// Hand the round's starts, deltas and ends (and telemetry) to the run (one lock).
    fn publish(&mut self, exchanges: &mut Vec<Exchange>, mut stops: Vec<(u16, Outcome)>) {
        // The telemetry exchange's items and end move to the link first.
        for ex in exchanges.iter_mut().filter(|ex| ex.telemetry) {
            ex.start_at = None;
            self.link.items.append(&mut ex.items);
            if let Some(outcome) = ex.end.take() {
                ex.sock = None;
                ex.tls = None;
                self.link.end = Some(match ex.tbody.as_mut().and_then(|b| b.end.take()) {
                    Some(body_end) => TelemetryEnd::Body(body_end),
                    None => TelemetryEnd::Exchange(outcome),
                });
                ex.done = true;
            }
        }
        let link = &self.link;
        let telemetry_news = !link.items.is_empty() || link.end.is_some() || link.accept;
        let busy = exchanges
            .iter()
            .any(|ex| ex.start_at.is_some() || !ex.deltas.is_empty() || ex.end.is_some());
        if !busy && stops.is_empty() && !telemetry_news {
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
        if telemetry_news {
            self.publish_telemetry(&mut fed, time);
        }
        for ex in exchanges.iter_mut() {
            if let Some(at) = ex.start_at.take() {
                fed.stream_started(ex.stream, at);
            }
            if ex.end.is_none() && !ex.telemetry {
                if let Some(i) = stops.iter().position(|(s, _)| *s == ex.stream) {
                    let (_, outcome) = stops.swap_remove(i);
                    ex.fail(outcome);
                }
            }
            ex.deltas.publish(&mut fed, ex.stream);
            if let Some(outcome) = ex.end.take() {
                ex.sock = None;
                ex.tls = None;
                let (finish_reason, usage) = match &ex.body {
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

impl Thread<'_> {
    /// The telemetry stream's news, under the run's lock: the preamble as
    /// soon as it is read; frames only once the client accepted the run (in
    /// the order they were read); the end after the items before it.
    fn publish_telemetry(&mut self, fed: &mut Fed, time: f64) {
        let Ok(mut state) = self.telemetry.lock() else {
            return;
        };
        let link = &mut self.link;
        if state.preamble.is_none() {
            if let Some(StreamItem::Preamble(p)) = link.items.first() {
                state.preamble = Some(p.clone());
                link.items.remove(0);
            }
        }
        if link.accept && !state.accepted {
            if let Some(p) = &state.preamble {
                match fed.bind_run(p.run_id) {
                    Ok(()) => state.accepted = true,
                    Err(e) => {
                        link.items.clear();
                        link.end = Some(TelemetryEnd::Exchange(Outcome::failed(
                            EndKind::Internal,
                            e,
                        )));
                    }
                }
            }
        }
        if state.accepted {
            for item in link.items.drain(..) {
                match item {
                    StreamItem::Frame(frame) => {
                        state.frames += 1;
                        state.bytes += frame.len() as u64;
                        fed.push_frame_at(&frame, time);
                    }
                    StreamItem::Dropped { frames } => {
                        // In stream order: the frames after it are not among the lost.
                        state.dropped += u64::from(frames);
                        fed.push_lost_at(Some(u64::from(frames)), time);
                    }
                    StreamItem::Heartbeat => state.heartbeats += 1,
                    StreamItem::Preamble(_) | StreamItem::End { .. } => {}
                }
            }
        }
        let held = !state.accepted && state.preamble.is_some() && !link.items.is_empty();
        if !held {
            if let Some(end) = link.end.take() {
                state.end = Some(end);
            }
        }
        // The client closes the stream only after the run, so any end seen
        // here comes before it: what the server sends from now on is lost.
        if state.accepted && state.end.is_some() && !link.end_told {
            link.end_told = true;
            fed.push_lost_at(None, time);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fed::Batch;
    use crate::reconcile::Reconciler;
    use std::io::BufRead;
    use std::net::TcpListener;

    /// A server that answers connection `i` with `answers[i]` (written in
    /// 7-byte pieces when `dribble`), keeping each request it read.
    fn serve(answers: Vec<Vec<u8>>, dribble: bool) -> (u16, Arc<Mutex<Vec<Vec<u8>>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&seen);
        std::thread::spawn(move || {
            for answer in answers {
                let Ok((conn, _)) = listener.accept() else {
                    return;
                };
                let kept = Arc::clone(&kept);
                std::thread::spawn(move || {
                    let mut reader = io::BufReader::new(conn.try_clone().unwrap());
                    let mut request = Vec::new();
                    let mut length = 0;
                    loop {
                        let mut line = Vec::new();
                        if reader.read_until(b'\n', &mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let text = String::from_utf8_lossy(&line).to_ascii_lowercase();
                        if let Some(v) = text.strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap();
                        }
                        request.extend_from_slice(&line);
                        if line == b"\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0; length];
                    reader.read_exact(&mut body).unwrap();
                    request.extend_from_slice(&body);
                    kept.lock().unwrap().push(request);
                    let mut conn = conn;
                    if dribble {
                        for piece in answer.chunks(7) {
                            if conn.write_all(piece).is_err() {
                                return;
                            }
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    } else {
                        let _ = conn.write_all(&answer);
                    }
                    if answer.ends_with(b"\r\n\r\n") {
                        // A head alone: stay silent until the client gives up.
                        std::thread::sleep(Duration::from_millis(1500));
                    }
                });
            }
        });
        (port, seen)
    }

    fn chunked(parts: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in parts {
            out.extend_from_slice(format!("{:x}\r\n{p}\r\n", p.len()).as_bytes());
        }
        out
    }

    const SSE_HEAD: &str =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

    fn event(text: &str, ids: &[u32], finish: Option<&str>) -> String {
        let finish = finish.map_or("null".into(), |f| format!("\"{f}\""));
        format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{text:?}}},\"token_ids\":{ids:?},\"finish_reason\":{finish}}}]}}\n\n"
        )
    }

    struct Run {
        fed: Arc<Mutex<Fed>>,
        streams: HttpStreams,
    }

    fn run(port: u16, n: u16, read: Option<Duration>) -> Run {
        run_with(port, n, read, ReadOptions::default())
    }

    fn run_with(port: u16, n: u16, read: Option<Duration>, options: ReadOptions) -> Run {
        let fed = Arc::new(Mutex::new(Fed::new(Reconciler::with_run_id([1; 16], n))));
        let target = Target {
            host: "127.0.0.1".into(),
            port,
            tls: false,
            shown: format!("127.0.0.1:{port}"),
        };
        let timeouts = Timeouts {
            connect: Duration::from_secs(5),
            read,
            write: Duration::from_secs(5),
        };
        let interval = Duration::from_millis(1);
        let streams =
            HttpStreams::start_with(Arc::clone(&fed), target, timeouts, interval, options).unwrap();
        Run { fed, streams }
    }

    fn request(n: u16) -> Vec<u8> {
        let headers = vec![
            ("Host".to_string(), "127.0.0.1".to_string()),
            ("Connection".to_string(), "keep-alive".to_string()),
        ];
        crate::http::request_bytes(
            "POST",
            "/v1/x?q=1",
            &headers,
            format!("{{\"s\":{n}}}").as_bytes(),
        )
        .unwrap()
    }

    /// Collect batches until `n` streams ended.
    fn collect(run: &Run, n: usize) -> Batch {
        let mut all = Batch::default();
        let deadline = Instant::now() + Duration::from_secs(10);
        while all.ends.len() < n && Instant::now() < deadline {
            let b = run.fed.lock().unwrap().take();
            all.texts.extend(b.texts);
            all.ends.extend(b.ends);
            all.events.extend(b.events);
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(all.ends.len(), n, "streams did not end in time");
        all.ends.sort_by_key(|e| e.stream);
        all
    }

    #[test]
    fn a_stream_split_anywhere_is_reconciled_queued_and_finished() {
        let body = [
            event("h\u{e9}", &[5, 6], None),
            event("", &[7], None),
            event("\u{4e16}!", &[8], Some("stop")),
            "data: [DONE]\n\n".into(),
        ];
        let parts: Vec<&str> = body.iter().map(String::as_str).collect();
        let mut answer = SSE_HEAD.as_bytes().to_vec();
        answer.extend(chunked(&parts));
        answer.extend_from_slice(b"0\r\n\r\n");
        let (port, requests) = serve(vec![answer], true);
        let mut r = run(port, 2, None);
        let before = monotonic();
        r.streams.add(1, request(1));
        let batch = collect(&r, 1);
        let after = monotonic();
        let end = &batch.ends[0];
        assert_eq!(end.outcome, Outcome::finished());
        assert_eq!(end.finish_reason.as_deref(), Some("stop"));
        let text: Vec<u8> = batch
            .texts
            .iter()
            .flat_map(|(_, t)| t.utf8.clone())
            .collect();
        assert_eq!(text, "h\u{e9}\u{4e16}!".as_bytes());
        let times: Vec<f64> = batch
            .texts
            .iter()
            .flat_map(|(_, t)| t.times.clone())
            .collect();
        let tokens: u64 = batch.texts.iter().map(|(_, t)| t.tokens).sum();
        assert_eq!((times.len(), tokens), (3, 4));
        assert!(before <= times[0] && times[2] <= after && times.windows(2).all(|w| w[0] <= w[1]));
        // The reconciler holds what a twin fed the same deltas holds.
        let mut twin = Reconciler::with_run_id([1; 16], 2);
        twin.push_sse_id(1, ""); // the chunks have no id
        twin.push_sse(1, "h\u{e9}", &[5, 6]);
        twin.push_sse(1, "", &[7]);
        twin.push_sse(1, "\u{4e16}!", &[8]);
        twin.finish_sse(1, Some("stop"));
        assert_eq!(r.fed.lock().unwrap().retained(), twin.retained());
        let sent = String::from_utf8(requests.lock().unwrap()[0].clone()).unwrap();
        assert_eq!(
            sent,
            "POST /v1/x?q=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 7\r\n\
             Connection: close\r\n\r\n{\"s\":1}"
        );
        r.streams.close();
        assert!(r.streams.is_closed());
    }

    fn ends_of(
        answers: Vec<Vec<u8>>,
        read: Option<Duration>,
    ) -> Vec<(Option<EndKind>, u16, String)> {
        let n = answers.len() as u16;
        let (port, _) = serve(answers, false);
        let mut r = run(port, n, read);
        for s in 0..n {
            r.streams.add(s, request(s));
        }
        let batch = collect(&r, n as usize);
        r.streams.close();
        batch
            .ends
            .into_iter()
            .map(|e| (e.outcome.kind, e.outcome.status, e.outcome.detail))
            .collect()
    }

    #[test]
    fn every_other_end_is_reported_precisely() {
        let first = event("a", &[1], None);
        let sse = |tail: &[u8]| {
            let mut a = SSE_HEAD.as_bytes().to_vec();
            a.extend(chunked(&[&first]));
            a.extend_from_slice(tail);
            a
        };
        let bad_event = "data: {oops\n\n";
        let answers = vec![
            // 100 Continue, then a chunked JSON error.
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 500 Oops\r\ncontent-type: application/json\r\n\
              transfer-encoding: chunked\r\n\r\n9\r\n{\"error\":\r\n8\r\n \"boom\"}\r\n0\r\n\r\n"
                .to_vec(),
            b"HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: 2\r\n\r\nhi"
                .to_vec(),
            sse(b""),
            sse(b"zz\r\n"),
            sse(format!("{:x}\r\n{bad_event}\r\n", bad_event.len()).as_bytes()),
            sse(b"0\r\n\r\n"),
            b"HTTP/2 200 OK\r\n\r\n".to_vec(),
            Vec::new(),
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: gzip\r\n\r\n"
                .to_vec(),
        ];
        let ends = ends_of(answers, Some(Duration::from_millis(300)));
        assert_eq!(
            ends,
            vec![
                (
                    Some(EndKind::HttpStatus),
                    500,
                    "{\"error\": \"boom\"}".into()
                ),
                (
                    Some(EndKind::NotSse),
                    200,
                    "text/html; charset=utf-8".into()
                ),
                (Some(EndKind::Closed), 0, String::new()),
                (
                    Some(EndKind::Framing),
                    0,
                    "invalid chunk size line \"zz\" in a chunked body".into()
                ),
                (
                    Some(EndKind::BadSse),
                    0,
                    "invalid JSON in SSE data: key must be a string at line 1 column 2".into()
                ),
                (Some(EndKind::NoFinish), 0, String::new()),
                (
                    Some(EndKind::Protocol),
                    0,
                    "not an HTTP/1.x status line: 'HTTP/2 200 OK'".into()
                ),
                (Some(EndKind::NoResponse), 0, String::new()),
                (Some(EndKind::Encoding), 0, "gzip".into()),
            ]
        );
    }

    /// One connection answered with `answer` in one write, then held open
    /// silently for `hold`: no data, no close.
    fn serve_then_hold(answer: Vec<u8>, hold: Duration) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut seen = Vec::new();
            let mut byte = [0u8; 1];
            // The request: its head, then a body of 7 bytes ({"s":1}).
            while !seen.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                seen.push(byte[0]);
            }
            let mut body = [0u8; 7];
            let _ = conn.read_exact(&mut body);
            conn.write_all(&answer).unwrap();
            std::thread::sleep(hold);
        });
        port
    }

    /// A read cut by the per-round cap (4 reads of 64 bytes here) leaves bytes
    /// in the socket and no new event will come: the rest is read in the next
    /// rounds all the same (an edge-triggered wait that forgot the socket was
    /// still readable would stall until the server closes, 5 s later).
    #[test]
    fn a_read_cut_by_the_round_cap_goes_on_without_new_data() {
        let texts: Vec<String> = (0..80).map(|i| format!("piece {i:02} ")).collect();
        let mut body: Vec<String> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| event(t, &[i as u32 + 5], (i == 79).then_some("stop")))
            .collect();
        body.push("data: [DONE]\n\n".into());
        let parts: Vec<&str> = body.iter().map(String::as_str).collect();
        let mut answer = SSE_HEAD.as_bytes().to_vec();
        answer.extend(chunked(&parts));
        answer.extend_from_slice(b"0\r\n\r\n");
        assert!(
            answer.len() > 20 * 4 * 64,
            "{} bytes: 20 capped rounds",
            answer.len()
        );
        for edges in [true, false] {
            let port = serve_then_hold(answer.clone(), Duration::from_secs(5));
            let options = ReadOptions {
                read_bytes: 64,
                edges,
            };
            let mut r = run_with(port, 2, None, options);
            let started = Instant::now();
            r.streams.add(1, request(1));
            let batch = collect(&r, 1);
            assert!(
                started.elapsed() < Duration::from_secs(4),
                "edges {edges}: stalled"
            );
            assert_eq!(batch.ends[0].outcome, Outcome::finished(), "edges {edges}");
            assert_eq!(batch.ends[0].finish_reason.as_deref(), Some("stop"));
            let text: Vec<u8> = batch
                .texts
                .iter()
                .flat_map(|(_, t)| t.utf8.clone())
                .collect();
            assert_eq!(text, texts.concat().as_bytes(), "edges {edges}");
            r.streams.close();
        }
    }

    #[test]
    fn refused_timeout_and_cancel() {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut r = run(port, 1, None);
        r.streams.add(0, request(0));
        let batch = collect(&r, 1);
        assert_eq!(
            batch.ends[0].outcome,
            Outcome::failed(EndKind::Refused, format!("127.0.0.1:{port}"))
        );
        r.streams.close();

        // A server that answers the head, then stays silent.
        let silent = SSE_HEAD.as_bytes().to_vec();
        let (port, _) = serve(vec![silent.clone(), silent], false);
        let mut r = run(port, 2, Some(Duration::from_millis(150)));
        let started = Instant::now();
        r.streams.add(0, request(0));
        let batch = collect(&r, 1);
        assert_eq!(batch.ends[0].outcome.kind, Some(EndKind::ReadTimeout));
        assert!(started.elapsed() >= Duration::from_millis(140));
        r.streams.close();

        let (port, _) = serve(vec![SSE_HEAD.as_bytes().to_vec()], false);
        let mut r = run(port, 1, None);
        r.streams.add(0, request(0));
        std::thread::sleep(Duration::from_millis(50));
        r.streams.cancel(0);
        let batch = collect(&r, 1);
        assert_eq!(batch.ends[0].outcome.kind, Some(EndKind::Cancelled));
        r.streams.close();
    }

    const TELEMETRY_HEAD: &str = "HTTP/1.1 200 OK\r\ncontent-type: application/x-parallelhue-telemetry\r\ntransfer-encoding: chunked\r\n\r\n";

    fn telemetry_item(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![kind];
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn chunked_bytes(data: &[u8]) -> Vec<u8> {
        let mut out = format!("{:x}\r\n", data.len()).into_bytes();
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
        out
    }

    fn telemetry_state_when(
        r: &Run,
        what: &str,
        done: impl Fn(&TelemetryState) -> bool,
    ) -> TelemetryState {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let state = r.streams.telemetry();
            if done(&state) {
                return state;
            }
            assert!(
                Instant::now() < deadline,
                "telemetry never {what}: {state:?}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn the_telemetry_stream_names_the_run_and_its_frames_wait_for_acceptance() {
        use crate::encode::{HelloFields, Sender};
        use crate::telemetry::stream::{ITEM_DROPPED, ITEM_END, ITEM_FRAME, ITEM_HEARTBEAT};
        let server_run = [0x5au8; 16];
        let mut stream = b"PHTS\x01\x00\x00\x00".to_vec();
        stream.extend_from_slice(&server_run);
        stream.extend_from_slice(&(1u32 << 20).to_le_bytes());
        stream.extend_from_slice(&2000u32.to_le_bytes());
        let hello = Sender::new(server_run, 7).hello(&HelloFields::simulated(1, 2));
        stream.extend(telemetry_item(ITEM_FRAME, &hello));
        stream.extend(telemetry_item(ITEM_HEARTBEAT, b""));
        stream.extend(telemetry_item(ITEM_DROPPED, &5u32.to_le_bytes()));
        let mut end = 1u16.to_le_bytes().to_vec();
        end.extend_from_slice(b"hub shutting down");
        stream.extend(telemetry_item(ITEM_END, &end));
        let mut answer = TELEMETRY_HEAD.as_bytes().to_vec();
        for piece in stream.chunks(13) {
            answer.extend(chunked_bytes(piece));
        }
        answer.extend_from_slice(b"0\r\n\r\n");
        let (port, requests) = serve(vec![answer], true);
        let r = run(port, 2, None);
        let headers = vec![("Host".to_string(), "127.0.0.1".to_string())];
        let post =
            crate::http::request_bytes("POST", "/v1/parallelhue/runs", &headers, b"").unwrap();
        r.streams.subscribe(post.clone()).unwrap();
        assert_eq!(
            r.streams.subscribe(post),
            Err("this run already has a telemetry stream")
        );
        let state = telemetry_state_when(&r, "named its run", |t| t.preamble.is_some());
        assert_eq!(state.preamble.as_ref().unwrap().run_id, server_run);
        // Not accepted yet: nothing reached the reconciler, whose run is still the client's.
        std::thread::sleep(Duration::from_millis(100));
        {
            let fed = r.fed.lock().unwrap();
            assert_eq!((fed.counters().frames, *fed.run_id()), (0, [1; 16]));
        }
        assert_eq!(r.streams.telemetry().end, None);
        r.streams.accept_telemetry();
        let state = telemetry_state_when(&r, "ended", |t| t.end.is_some());
        assert_eq!(
            (
                state.accepted,
                state.frames,
                state.bytes,
                state.heartbeats,
                state.dropped
            ),
            (true, 1, hello.len() as u64, 1, 5)
        );
        assert_eq!(
            state.end,
            Some(TelemetryEnd::Body(BodyEnd::Server {
                code: 1,
                message: "hub shutting down".into()
            }))
        );
        let fed = r.fed.lock().unwrap();
        assert_eq!(*fed.run_id(), server_run);
        assert_eq!((fed.counters().frames, fed.sources().len()), (1, 1));
        // The dropped item, in stream order, failed every stream without a verdict.
        for stream in 0..2 {
            assert_eq!(
                fed.verdict(stream),
                crate::reconcile::Verdict::Failed(
                    "telemetry lost: 5 frames dropped by the server".into()
                )
            );
        }
        drop(fed);
        let sent = String::from_utf8(requests.lock().unwrap()[0].clone()).unwrap();
        assert!(
            sent.starts_with("POST /v1/parallelhue/runs HTTP/1.1\r\n"),
            "{sent}"
        );
    }

    #[test]
    fn a_telemetry_stream_that_ends_before_the_run_fails_the_open_streams() {
        use crate::encode::{HelloFields, Sender};
        use crate::telemetry::stream::ITEM_FRAME;
        let server_run = [0x6bu8; 16];
        let mut stream = b"PHTS\x01\x00\x00\x00".to_vec();
        stream.extend_from_slice(&server_run);
        stream.extend_from_slice(&(1u32 << 20).to_le_bytes());
        stream.extend_from_slice(&2000u32.to_le_bytes());
        let hello = Sender::new(server_run, 9).hello(&HelloFields::simulated(1, 2));
        stream.extend(telemetry_item(ITEM_FRAME, &hello));
        // The connection closes after a whole item, without the end item.
        let mut answer = TELEMETRY_HEAD.as_bytes().to_vec();
        answer.extend(chunked_bytes(&stream));
        answer.extend_from_slice(b"0\r\n\r\n");
        let (port, _) = serve(vec![answer], false);
        let r = run(port, 3, None);
        let headers = vec![("Host".to_string(), "127.0.0.1".to_string())];
        let post =
            crate::http::request_bytes("POST", "/v1/parallelhue/runs", &headers, b"").unwrap();
        r.streams.subscribe(post).unwrap();
        telemetry_state_when(&r, "named its run", |t| t.preamble.is_some());
        r.streams.accept_telemetry();
        let state = telemetry_state_when(&r, "ended", |t| t.end.is_some());
        assert_eq!(
            state.end,
            Some(TelemetryEnd::Body(BodyEnd::Stream(
                crate::telemetry::stream::StreamError::ClosedWithoutEnd
            )))
        );
        let fed = r.fed.lock().unwrap();
        assert_eq!(fed.counters().frames, 1);
        for stream in 0..3 {
            assert_eq!(
                fed.verdict(stream),
                crate::reconcile::Verdict::Failed(
                    "telemetry lost: the telemetry stream ended before the run".into()
                )
            );
        }
    }

    #[test]
    fn a_refused_telemetry_stream_says_why() {
        let post = || {
            let headers = vec![("Host".to_string(), "127.0.0.1".to_string())];
            crate::http::request_bytes("POST", "/v1/parallelhue/runs", &headers, b"").unwrap()
        };
        let ends = |answer: Vec<u8>| {
            let (port, _) = serve(vec![answer], false);
            let r = run(port, 1, Some(Duration::from_millis(300)));
            r.streams.subscribe(post()).unwrap();
            telemetry_state_when(&r, "ended", |t| t.end.is_some())
                .end
                .unwrap()
        };
        assert_eq!(
            ends(
                b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: 24\r\n\r\n{\"error\":\"Unauthorized\"}"
                    .to_vec()
            ),
            TelemetryEnd::Exchange(Outcome::http(
                EndKind::HttpStatus,
                401,
                "{\"error\":\"Unauthorized\"}"
            ))
        );
        assert_eq!(
            ends(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 0\r\n\r\n"
                    .to_vec()
            ),
            TelemetryEnd::Exchange(Outcome::http(EndKind::NotSse, 200, "text/event-stream"))
        );
        let mut cut = TELEMETRY_HEAD.as_bytes().to_vec();
        cut.extend(chunked_bytes(b"PHTS\x01\x00\x00\x00"));
        assert_eq!(
            ends(cut).to_owned(),
            TelemetryEnd::Body(BodyEnd::Http(BodyError::Incomplete { framing: "chunked" }))
        );
        // Nobody listening: the exchange's own outcome.
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let r = run(port, 1, None);
        r.streams.subscribe(post()).unwrap();
        assert_eq!(
            telemetry_state_when(&r, "ended", |t| t.end.is_some()).end,
            Some(TelemetryEnd::Exchange(Outcome::failed(
                EndKind::Refused,
                format!("127.0.0.1:{port}")
            )))
        );
    }
}
