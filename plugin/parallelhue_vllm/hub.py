"""The server-local telemetry hub: frames in over AF_UNIX, out inside the responses.

One hub runs in every API-server process that serves in-band telemetry
(`endpoint.py`, or the simulated engine). Every emitter of the server
(EngineCore, each API-server process) sends the frames of each request of
ours to every hub of its server (`destination.py`), as envelopes keyed by
the request's vLLM-internal id (`inband.py`); the hub of the process that
serves the request holds its claim and keeps them for its response.

- Where: `<hub base dir>/<scope>/hub-<pid>.sock`, an AF_UNIX datagram socket.
  The scope is one random id per server, chosen by the first process that
  loads the plugin and inherited by every process vLLM starts
  (`PARALLELHUE_HUB_SCOPE`), so two servers on one host never mix. The base
  directory and the scope directory are 0700, the socket 0600, all owned by
  the server's user; senders refuse anything else.
- Who may send: datagrams carry `SCM_CREDENTIALS`; any other uid than the
  hub's own is rejected (counted), as the client's socket does.
- What it keeps: only frames of requests claimed here right now. A claim is
  made before vLLM sees the request and bound to its internal id when vLLM
  registers it (in the request's own task), before the engine can produce a
  frame for it; frames of any other request are discarded at once (counted
  as `unclaimed`). Nobody can claim another request: the id is vLLM's, with
  its random suffix, and only the request's own handler binds it.
- Bounded: per claim `buffer_bytes` (4 MiB), all claims together
  `total_bytes` (64 MiB), at most `max_claims` (1024). From the first frame
  that does not fit, a claim keeps nothing more (counted): its response's end
  item says how many were dropped, and the client fails that stream only.
- Cost to the engine: none beyond the emitters' own sends. The hub's thread
  only receives, checks and appends; encoding for HTTP happens in the
  response's coroutine.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import os
import secrets
import select
import socket
import stat
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from . import inband, wire

__all__ = [
    "ENV_HUB_DIR",
    "ENV_SCOPE",
    "Claim",
    "Hub",
    "HubError",
    "HubFull",
    "HubLimits",
    "base_dir",
    "check_private_dir",
    "ensure_scope",
    "scope_dir",
]

log = logging.getLogger("vllm.parallelhue")

ENV_HUB_DIR = "PARALLELHUE_HUB_DIR"
ENV_SCOPE = "PARALLELHUE_HUB_SCOPE"
SOCKET_PREFIX = "hub-"
SOCKET_SUFFIX = ".sock"
RCVBUF_BYTES = 8 << 20
# Bytes a buffered frame costs beyond its length (the bytes object and the deque slot).
ITEM_OVERHEAD = 96
# A scope directory younger than this is never garbage-collected (its hub may be starting).
STALE_SCOPE_SECONDS = 60.0

_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid
_NOT_A_FRAME = -1
_NO_CREDENTIALS = -2
_HAVE_CREDS = hasattr(socket, "SO_PASSCRED") and hasattr(socket, "SCM_CREDENTIALS")


class HubError(Exception):
    """A hub directory or socket that is unsafe or unusable (one line naming the fix)."""


class HubFull(Exception):
    """No claim slot is free (`max_claims` requests with in-band telemetry are open)."""


# ------------------------------------------------------------------ paths
def base_dir() -> str:
    """The hubs' base directory (each server has its own scope directory inside).

    $PARALLELHUE_HUB_DIR, else $XDG_RUNTIME_DIR/parallelhue-hub, else <tmp>/parallelhue-hub-<uid>.
    """
    explicit = os.environ.get(ENV_HUB_DIR)
    if explicit:
        return os.path.abspath(explicit)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "parallelhue-hub")
    return os.path.join(tempfile.gettempdir(), f"parallelhue-hub-{os.geteuid()}")


def ensure_scope() -> str:
    """This server's scope id; chosen here (and exported to child processes) when unset."""
    scope = os.environ.get(ENV_SCOPE, "")
    if not _valid_scope(scope):
        scope = secrets.token_hex(8)
        os.environ[ENV_SCOPE] = scope
    return scope


def _valid_scope(scope: str) -> bool:
    return 1 <= len(scope) <= 32 and all(c in "0123456789abcdef" for c in scope)


def scope_dir(scope: str, base: str | None = None) -> str:
    if not _valid_scope(scope):
        raise HubError(f"invalid hub scope '{scope}': expected 1-32 lowercase hex characters")
    return os.path.join(base or base_dir(), scope)


def check_private_dir(path: str, *, create: bool) -> None:
    """A directory only this user can use: ours, 0700, not a symlink (made so with `create`)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        if not create:
            raise HubError(f"hub directory {path} does not exist") from None
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as error:
            raise HubError(
                f"cannot create hub directory {path} ({error.strerror}): set {ENV_HUB_DIR} "
                "to a writable directory"
            ) from None
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
            os.chmod(path, 0o700)
            info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise HubError(f"hub directory {path} is not a real directory: set {ENV_HUB_DIR}")
    if info.st_uid != os.geteuid():
        raise HubError(
            f"hub directory {path} is owned by uid {info.st_uid}, not {os.geteuid()}: "
            f"set {ENV_HUB_DIR} to a directory of your own"
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        raise HubError(
            f"hub directory {path} has mode {stat.S_IMODE(info.st_mode):04o}, expected 0700: "
            f"run chmod 700 {path}"
        )


def _socket_alive(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)
        return True
    except OSError as error:
        return error.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    finally:
        probe.close()


def _collect_stale(base: str, own_scope: str) -> None:
    """Remove sockets of hubs that died without cleaning up, and their empty scope dirs."""
    try:
        scopes = list(os.scandir(base))
    except OSError:
        return
    now = time.time()
    for entry in scopes:
        if not entry.is_dir(follow_symlinks=False) or not _valid_scope(entry.name):
            continue
        try:
            young = now - entry.stat(follow_symlinks=False).st_mtime < STALE_SCOPE_SECONDS
            sockets = [e for e in os.scandir(entry.path) if e.name.startswith(SOCKET_PREFIX)]
        except OSError:
            continue
        for sock_entry in sockets:
            if not _socket_alive(sock_entry.path):
                try:
                    os.unlink(sock_entry.path)
                except OSError:
                    pass
        if entry.name != own_scope and not young:
            try:
                os.rmdir(entry.path)  # only succeeds when empty
            except OSError:
                pass


# ------------------------------------------------------------------ limits
@dataclass(slots=True)
class HubLimits:
    buffer_bytes: int = 4 << 20
    total_bytes: int = 64 << 20
    max_claims: int = 1024
    # How long a response's end waits for the frames of its final step.
    wait_seconds: float = 5.0

    @classmethod
    def from_env(cls) -> HubLimits:
        """Defaults, overridden by positive numbers in PARALLELHUE_HUB_BUFFER_BYTES,
        PARALLELHUE_HUB_TOTAL_BYTES, PARALLELHUE_HUB_MAX_CLAIMS and
        PARALLELHUE_HUB_WAIT_SECONDS."""
        limits = cls()
        for name, kind in (
            ("buffer_bytes", int),
            ("total_bytes", int),
            ("max_claims", int),
            ("wait_seconds", float),
        ):
            raw = os.environ.get(f"PARALLELHUE_HUB_{name.upper()}")
            if raw:
                try:
                    value = kind(raw)
                except ValueError:
                    log.warning(
                        "parallelhue: PARALLELHUE_HUB_%s=%r is not a number; using %s",
                        name.upper(),
                        raw,
                        getattr(limits, name),
                    )
                    continue
                if value > 0:
                    setattr(limits, name, value)
        return limits


# ------------------------------------------------------------------ claims
class Claim:
    """One request's frames, held for its own response (inband.py).

    Made by the server around the request (`Hub.claim`), bound to vLLM's
    internal id by the frontend hook (`bind`); the hub thread appends
    (`_offer`), the response's coroutine takes (`take`, `finish`), always on
    the event loop the claim was made on.
    """

    def __init__(self, hub: Hub, loop: asyncio.AbstractEventLoop) -> None:
        self.hub = hub
        self.key: bytes | None = None
        self._loop = loop
        self._queue: collections.deque[bytes] = collections.deque()
        self.buffered = 0  # accounted bytes in _queue
        self.frames = 0  # frame items handed to the response
        self.dropped = 0  # frames discarded once the buffer overflowed
        self.poisoned = False  # a frame was dropped: nothing more is kept
        self.hub_closed = False
        self.closed = False
        # What the senders said of the request (docs/PROTOCOL.md, "In-band telemetry").
        self.sched_tokens = 0  # tokens the scheduler's frames cover so far
        self.sched_done = False
        self.text_final: int | None = None  # tokens of the frontend's finished record
        self.text_closed = False
        self.refused = False
        self._event = asyncio.Event()

    def bind(self, request_id: str) -> bool:
        """Take the frames of vLLM's request `request_id`; False if bound already,
        or when another claim holds that id."""
        key = request_id.encode("utf-8", "surrogateescape")
        hub = self.hub
        with hub._lock:
            if self.key is not None or self.closed or key in hub._claims or not key:
                return False
            self.key = key
            hub._claims[key] = self
            return True

    # hub thread, under hub._lock
    def _offer(self, envelope: inband.Envelope) -> int:
        """Note one envelope: 1 kept, 0 nothing to keep, -1 dropped."""
        flags = envelope.flags
        if envelope.role == wire.SOURCE_SCHEDULER:
            if envelope.end_tokens > self.sched_tokens:
                self.sched_tokens = envelope.end_tokens
            if flags & (inband.FLAG_FINISHED | inband.FLAG_CLOSED):
                self.sched_done = True
        else:
            if flags & inband.FLAG_FINISHED and self.text_final is None:
                self.text_final = envelope.end_tokens
            if flags & inband.FLAG_CLOSED:
                self.text_closed = True
            if flags & inband.FLAG_REFUSED:
                self.refused = True
        frame = envelope.frame
        if not frame or self.closed or self.hub_closed:
            return 0
        if self.poisoned:
            self.dropped += 1
            return -1
        cost = len(frame) + ITEM_OVERHEAD
        hub = self.hub
        if (
            self.buffered + cost > hub.limits.buffer_bytes
            or hub._buffered + cost > hub.limits.total_bytes
        ):
            # From the first loss on nothing is kept: the client fails this stream.
            self.poisoned = True
            self.dropped += 1 + len(self._queue)
            self._free()
            return -1
        self._queue.append(frame)
        self.buffered += cost
        hub._buffered += cost
        return 1

    # The simulated engine's faults (parallelhue.sim.stream_faults): what a full buffer
    # and a closing hub do to a claim, on purpose.
    def fault_poison(self, frames: int) -> None:
        with self.hub._lock:
            self.poisoned = True
            self.dropped += max(frames, 1) + len(self._queue)
            self._free()

    def fault_hub_closed(self) -> None:
        with self.hub._lock:
            self.hub_closed = True
            self._free()

    def _free(self) -> None:
        self.hub._buffered -= self.buffered
        self.buffered = 0
        self._queue.clear()

    def _wake(self) -> None:
        # From the hub thread. Always: the response's pump and its end may both be
        # waiting (a spurious wake only makes a waiter look again).
        try:
            self._loop.call_soon_threadsafe(self._event.set)
        except RuntimeError:  # the loop is closed: nobody is reading any more
            pass

    def complete(self) -> bool:
        """Whether every frame the response needs is in (or none will be kept)."""
        if self.refused or self.poisoned or self.hub_closed:
            return True
        return self._text_ok() and self._sched_ok()

    def _text_ok(self) -> bool:
        return self.text_final is not None or self.text_closed

    def _sched_ok(self) -> bool:
        final = self.text_final
        return self.sched_done or (final is not None and self.sched_tokens >= final)

    # event loop
    def take(self) -> bytes:
        """The kept frames as SSE events (b"" when none are waiting)."""
        with self.hub._lock:
            if not self._queue:
                return b""
            frames = list(self._queue)
            self._free()
            self.frames += len(frames)
        return _events([inband.frame_item(frame) for frame in frames])

    async def news(self, timeout: float | None = None, *, until_complete: bool = False) -> None:
        """Return once frames came (or, `until_complete`, the claim is complete), or after
        `timeout`. Checked under the hub's lock: nothing that came before is missed."""
        with self.hub._lock:
            if self._queue or self.closed or (until_complete and self.complete()):
                return
            self._event.clear()
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except asyncio.TimeoutError:  # noqa: UP041 - the plugin also runs on Python 3.10
            pass

    async def finish(self) -> bytes:
        """The response's end: wait (at most the hub's wait_seconds) until the frames
        of the final step are in, then the last frames and the end item, as events."""
        hub = self.hub
        started = time.monotonic()
        # Never bound: not a request of ours (no frames can come), no wait.
        deadline = started + (hub.limits.wait_seconds if self.key is not None else 0.0)
        parts = []
        while True:
            parts.append(self.take())  # an empty queue: news() then waits, never spins
            if self.complete():
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await self.news(left, until_complete=True)
        waited_us = int((time.monotonic() - started) * 1e6)
        parts.append(self.take())
        tail = b"".join(parts)
        with hub._lock:
            status = self._status()
            end = inband.end_item(status, self.frames, self.dropped, waited_us)
            hub._note_wait(waited_us, status)
        self.close()
        return tail + inband.event(end)

    def _status(self) -> int:
        if self.hub_closed:
            return inband.STATUS_HUB_CLOSED
        if self.poisoned:
            return inband.STATUS_DROPPED
        if self.refused:
            return inband.STATUS_COMPLETE
        text, sched = self._text_ok(), self._sched_ok()
        if text and sched:
            return inband.STATUS_COMPLETE
        if not text and not sched:
            return inband.STATUS_MISSING_BOTH
        return inband.STATUS_MISSING_TEXT if not text else inband.STATUS_MISSING_SCHEDULER

    def close(self) -> None:
        """The response is over (ended, or its client gone): free everything now."""
        hub = self.hub
        with hub._lock:
            if self.closed:
                return
            self.closed = True
            self._free()
            if self.key is not None and hub._claims.get(self.key) is self:
                del hub._claims[self.key]
            hub._live.discard(self)
        self._event.set()


def _events(items: list[bytes]) -> bytes:
    """Items as SSE events of at most MAX_EVENT_ITEMS_BYTES of items each."""
    out: list[bytes] = []
    batch: list[bytes] = []
    used = 0
    for item in items:
        if batch and used + len(item) > inband.MAX_EVENT_ITEMS_BYTES:
            out.append(inband.event(b"".join(batch)))
            batch, used = [], 0
        batch.append(item)
        used += len(item)
    if batch:
        out.append(inband.event(b"".join(batch)))
    return b"".join(out)


# ------------------------------------------------------------------ hub
class Hub:
    """Receive every frame of this server's requests; keep the claimed ones, bounded."""

    def __init__(
        self,
        scope: str,
        *,
        base: str | None = None,
        limits: HubLimits | None = None,
        accept_uids: frozenset[int] | None = None,
        name: str | None = None,
    ) -> None:
        self.scope = scope
        self.base = base or base_dir()
        self.dir = scope_dir(scope, self.base)
        # One hub per process: the pid names it (`name` only for tests running several).
        socket_name = f"{SOCKET_PREFIX}{name or os.getpid()}{SOCKET_SUFFIX}"
        self.path = os.path.join(self.dir, socket_name)
        self.limits = limits or HubLimits()
        self._accept_uids = accept_uids if accept_uids is not None else frozenset({os.geteuid()})
        self._lock = threading.Lock()
        self._claims: dict[bytes, Claim] = {}  # bound claims by vLLM's request id
        self._live: set[Claim] = set()  # every open claim, bound or not
        self._buffered = 0
        self._counters = {
            "frames": 0,  # frames received
            "accepted": 0,  # kept for a claim
            "unclaimed": 0,  # no claim for their request here
            "dropped": 0,  # a claim's buffer was full
            "rejected": 0,  # not an envelope datagram
            "rejected_uid": 0,  # sent by another user
            "claims": 0,  # ever made
            "waits": 0,  # responses that ended (their wait measured)
            "wait_us_total": 0,
            "wait_us_max": 0,
            "incomplete": 0,  # ends whose status was not complete
        }
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closing = False

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Bind the socket and start the receiving thread. Raises HubError (one line)."""
        if not _HAVE_CREDS:
            raise HubError(
                f"the telemetry hub needs SO_PASSCRED (Linux); {sys.platform} is not supported"
            )
        check_private_dir(self.base, create=True)
        _collect_stale(self.base, self.scope)
        check_private_dir(self.dir, create=True)
        if len(os.fsencode(self.path)) > 107:
            raise HubError(
                f"hub socket path {self.path} exceeds the AF_UNIX limit of 107 bytes: set "
                f"{ENV_HUB_DIR} to a shorter directory"
            )
        try:
            os.unlink(self.path)  # a dead hub of a recycled pid
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            _grow_rcvbuf(sock)
            sock.bind(self.path)
            os.chmod(self.path, 0o600)
            sock.setblocking(False)  # the thread waits in poll(), then drains without waiting
        except OSError as error:
            sock.close()
            raise HubError(f"cannot bind hub socket {self.path}: {error.strerror}") from None
        self._sock = sock
        thread = threading.Thread(target=self._receive_loop, name="parallelhue-hub", daemon=True)
        self._thread = thread
        thread.start()

    def close(self) -> None:
        """Stop receiving, end every claim (their responses say so), remove the socket."""
        if self._closing:
            return
        self._closing = True
        if self._thread is not None:
            _poke(self.path)  # wake the receiving thread now rather than at its next timeout
            self._thread.join(2.0)
        with self._lock:
            for claim in list(self._live):
                claim.hub_closed = True
        for claim in list(self._live):
            claim._wake()
        if self._sock is not None:
            self._sock.close()
            try:
                os.unlink(self.path)
            except OSError:
                pass
            try:
                os.rmdir(self.dir)  # only when no other hub of this server remains
            except OSError:
                pass

    # ------------------------------------------------------------ claims
    def claim(self) -> Claim:
        """A claim for the request about to be served, on the running event loop.

        Raises HubFull."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._closing:
                raise HubFull("the server's telemetry hub is shutting down")
            if len(self._live) >= self.limits.max_claims:
                raise HubFull(
                    f"{self.limits.max_claims} requests with in-band telemetry are open, "
                    "the most this server allows"
                )
            claim = Claim(self, loop)
            self._live.add(claim)
            self._counters["claims"] += 1
            return claim

    def _note_wait(self, waited_us: int, status: int) -> None:
        # Under self._lock.
        counters = self._counters
        counters["waits"] += 1
        counters["wait_us_total"] += waited_us
        counters["wait_us_max"] = max(counters["wait_us_max"], waited_us)
        if status != inband.STATUS_COMPLETE:
            counters["incomplete"] += 1

    def stats(self) -> dict[str, int]:
        """Counters, the open claims and the bytes they hold now."""
        with self._lock:
            result = dict(self._counters)
            result["open_claims"] = len(self._live)
            result["buffered_bytes"] = self._buffered
        result["process"] = os.getpid()  # which API-server process answered
        return result

    # ------------------------------------------------------------ receiving
    def _receive_loop(self) -> None:
        sock = self._sock
        assert sock is not None
        space = socket.CMSG_SPACE(_CREDS.size)
        limit = inband.MAX_ENVELOPE_DATAGRAM
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        while not self._closing:
            batch: list[tuple[bytes, int]] = []
            try:
                if poller.poll(500):
                    # Drain what is queued: one lock and one wake-up per claim per
                    # batch, however many datagrams came.
                    while len(batch) < 256:
                        data, ancillary, flags, _ = sock.recvmsg(limit + 1, space)
                        batch.append(_checked(data, ancillary, flags, limit))
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                if self._closing:
                    return
                time.sleep(0.01)
            if self._closing:
                return
            if batch:
                self._route(batch)

    def _route(self, batch: list[tuple[bytes, int]]) -> None:
        counters = self._counters
        touched: set[Claim] = set()
        accept = self._accept_uids
        claims = self._claims
        with self._lock:
            for data, uid in batch:
                if uid == _NOT_A_FRAME:
                    counters["rejected"] += 1
                    continue
                if uid not in accept:  # includes _NO_CREDENTIALS
                    counters["rejected_uid"] += 1
                    continue
                envelopes = inband.parse_envelopes(data)
                if envelopes is None:
                    counters["rejected"] += 1
                    continue
                for envelope in envelopes:
                    if envelope.frame:
                        counters["frames"] += 1
                    claim = claims.get(envelope.key)
                    if claim is None:
                        if envelope.frame:
                            counters["unclaimed"] += 1
                        continue
                    kept = claim._offer(envelope)
                    if kept > 0:
                        counters["accepted"] += 1
                    elif kept < 0:
                        counters["dropped"] += 1
                    touched.add(claim)
        for claim in touched:
            claim._wake()


def _checked(
    data: bytes, ancillary: list[tuple[int, int, bytes]], flags: int, limit: int
) -> tuple[bytes, int]:
    """(datagram, sender uid); _NOT_A_FRAME or _NO_CREDENTIALS instead of a uid."""
    if flags & socket.MSG_TRUNC or len(data) > limit or data[:4] != inband.ENVELOPE_MAGIC:
        return data, _NOT_A_FRAME
    for level, kind, payload in ancillary:
        if (
            level == socket.SOL_SOCKET
            and kind == socket.SCM_CREDENTIALS
            and len(payload) >= _CREDS.size
        ):
            return data, int(_CREDS.unpack_from(payload)[1])
    return data, _NO_CREDENTIALS


def _poke(path: str) -> None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"", path)
    except OSError:
        pass


def _grow_rcvbuf(sock: socket.socket) -> None:
    force = getattr(socket, "SO_RCVBUFFORCE", None)
    if force is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, RCVBUF_BYTES)
            return
        except OSError:
            pass
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
