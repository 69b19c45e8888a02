"""The server-local telemetry hub: frames in over AF_UNIX, a bounded stream out per subscriber.

One hub runs in every API-server process that serves the telemetry route
(`endpoint.py`, or the simulated engine). Every emitter of the server
(EngineCore, each API-server process) sends each frame to every hub of its
server (`destination.py`), so whichever process an HTTP subscriber lands on,
its hub sees every process's frames.

- Where: `<hub base dir>/<scope>/hub-<pid>.sock`, an AF_UNIX datagram socket.
  The scope is one random id per server, chosen by the first process that
  loads the plugin and inherited by every process vLLM starts
  (`PARALLELHUE_HUB_SCOPE`), so two servers on one host never mix. The base
  directory and the scope directory are 0700, the socket 0600, all owned by
  the server's user; senders refuse anything else.
- Who may send: datagrams carry `SCM_CREDENTIALS`; any other uid than the
  hub's own is rejected (counted), as the client's socket does.
- What it keeps: only frames of runs that have a subscriber right now. A run
  is created by its subscriber (the hub picks the 128-bit run id), so a run
  exists in the hub before any request names it and nothing is lost; frames
  of any other run id are discarded at once (counted as `unclaimed`).
- Bounded: per subscriber `buffer_bytes` (4 MiB), all subscribers together
  `total_bytes` (64 MiB), at most `max_subscribers` (64). A frame that does
  not fit is discarded and counted; the subscriber's stream then carries a
  `dropped` item before the next frame, so the client sees the loss. A
  subscriber that takes nothing for `stall_seconds` (30 s; an idle stream
  still takes a heartbeat every 2 s) is cut: its buffer is freed and its
  stream gets an `end` item if it ever reads again.
- Cost to the engine: none beyond the emitters' own sends. The hub's thread
  only receives, checks and appends; encoding for HTTP happens in the
  subscriber's coroutine.
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

from . import telemetry_stream as ts

__all__ = [
    "ENV_HUB_DIR",
    "ENV_SCOPE",
    "Hub",
    "HubError",
    "HubFull",
    "HubLimits",
    "Subscription",
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
# Largest chunk handed to HTTP at once.
CHUNK_BYTES = 256 << 10
# A scope directory younger than this is never garbage-collected (its hub may be starting).
STALE_SCOPE_SECONDS = 60.0

_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid
_FRAME_MAGIC = b"PHUE"
_RUN_ID = slice(8, 24)  # the run id in every frame header (docs/PROTOCOL.md, common header)
_NOT_A_FRAME = -1
_NO_CREDENTIALS = -2
_HAVE_CREDS = hasattr(socket, "SO_PASSCRED") and hasattr(socket, "SCM_CREDENTIALS")


class HubError(Exception):
    """A hub directory or socket that is unsafe or unusable (one line naming the fix)."""


class HubFull(Exception):
    """No subscription slot is free."""


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
    max_subscribers: int = 64
    stall_seconds: float = 30.0
    heartbeat_seconds: float = 2.0

    @classmethod
    def from_env(cls) -> HubLimits:
        """Defaults, overridden by positive numbers in PARALLELHUE_HUB_BUFFER_BYTES,
        PARALLELHUE_HUB_TOTAL_BYTES, PARALLELHUE_HUB_MAX_SUBSCRIBERS and
        PARALLELHUE_HUB_STALL_SECONDS."""
        limits = cls()
        for name, kind in (
            ("buffer_bytes", int),
            ("total_bytes", int),
            ("max_subscribers", int),
            ("stall_seconds", float),
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


# ------------------------------------------------------------------ subscription
class Subscription:
    """One run's bounded queue of encoded stream items, read by one HTTP response.

    The hub thread appends (`_offer`); the response's coroutine takes
    (`next_chunk`), always on the event loop the subscription was made on.
    """

    def __init__(self, hub: Hub, run_id: bytes, loop: asyncio.AbstractEventLoop) -> None:
        self.hub = hub
        self.run_id = run_id
        self._loop = loop
        self._queue: collections.deque[bytes] = collections.deque()
        self.buffered = 0  # accounted bytes in _queue
        self._pending_dropped = 0  # discarded since the last dropped item
        self.dropped = 0  # discarded in total
        self.frames = 0  # accepted in total
        self.last_pull = time.monotonic()
        self._event = asyncio.Event()
        self._waiting = False
        self._preamble_sent = False
        self._end: tuple[int, str] | None = None
        self.finished = False

    @property
    def run_hex(self) -> str:
        return self.run_id.hex()

    # hub thread, under hub._lock
    def _offer(self, item: bytes) -> bool:
        """Append one encoded frame item; False when it does not fit (counted as dropped)."""
        if self._end is not None:
            return False
        cost = len(item) + ITEM_OVERHEAD
        hub = self.hub
        if (
            self.buffered + cost > hub.limits.buffer_bytes
            or hub._buffered + cost > hub.limits.total_bytes
        ):
            self._pending_dropped += 1
            self.dropped += 1
            return False
        self._queue.append(item)
        self.buffered += cost
        hub._buffered += cost
        self.frames += 1
        return True

    # hub thread or loop, under hub._lock
    def _cut(self, code: int, message: str) -> None:
        """End the stream: free the buffer now; the reader gets the end item next."""
        if self._end is not None:
            return
        self._end = (code, message)
        self.hub._buffered -= self.buffered
        self.buffered = 0
        self._queue.clear()

    def _wake_if_waiting(self) -> None:
        # Called under hub._lock from the hub thread.
        if self._waiting:
            self._waiting = False
            try:
                self._loop.call_soon_threadsafe(self._event.set)
            except RuntimeError:  # the loop is closed: nobody is reading any more
                pass

    # event loop
    async def next_chunk(self) -> bytes | None:
        """The next bytes of the HTTP body (preamble first); None once the end item was given."""
        hub = self.hub
        if not self._preamble_sent:
            self._preamble_sent = True
            self.last_pull = time.monotonic()
            return ts.preamble(
                self.run_id, hub.limits.buffer_bytes, int(hub.limits.heartbeat_seconds * 1000)
            )
        if self.finished:
            return None
        while True:
            with hub._lock:
                self.last_pull = time.monotonic()
                parts: list[bytes] = []
                if self._pending_dropped:
                    parts.append(ts.dropped_item(self._pending_dropped))
                    self._pending_dropped = 0
                size = 0
                queue = self._queue
                while queue and size < CHUNK_BYTES:
                    item = queue.popleft()
                    size += len(item)
                    cost = len(item) + ITEM_OVERHEAD
                    self.buffered -= cost
                    hub._buffered -= cost
                    parts.append(item)
                if parts:
                    hub._served += len(parts)
                    return b"".join(parts)
                if self._end is not None:
                    self.finished = True
                    hub._release(self)
                    return ts.end_item(*self._end)
                self._event.clear()
                self._waiting = True
            try:
                await asyncio.wait_for(self._event.wait(), hub.limits.heartbeat_seconds)
            except asyncio.TimeoutError:  # noqa: UP041 - the plugin also runs on Python 3.10
                with hub._lock:
                    self._waiting = False
                    if not self._queue and self._end is None and not self._pending_dropped:
                        self.last_pull = time.monotonic()
                        return ts.heartbeat_item()

    def close(self) -> None:
        """The HTTP response is over (client gone or stream ended): free everything now."""
        with self.hub._lock:
            self._cut(ts.END_OTHER, "subscriber closed")
            self.finished = True
            self.hub._release(self)
            self._waiting = False
        self._event.set()  # a next_chunk() waiting on the loop returns at once


# ------------------------------------------------------------------ hub
class Hub:
    """Receive every frame of this server; keep the subscribed runs' frames, bounded."""

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
        self._subs: dict[bytes, Subscription] = {}
        self._buffered = 0
        self._served = 0
        self._counters = {
            "frames": 0,  # datagrams received
            "accepted": 0,  # buffered for a subscriber
            "unclaimed": 0,  # no subscriber for their run
            "dropped": 0,  # a subscriber's buffer was full
            "rejected": 0,  # not a frame (too short, bad magic, oversized)
            "rejected_uid": 0,  # sent by another user
            "subscriptions": 0,  # ever made
            "cut_stalled": 0,  # subscribers cut for not reading
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
        """Stop receiving, end every stream (their readers get an end item), remove the socket."""
        if self._closing:
            return
        self._closing = True
        if self._thread is not None:
            _poke(self.path)  # wake the receiving thread now rather than at its next timeout
            self._thread.join(2.0)
        with self._lock:
            for sub in list(self._subs.values()):
                sub._cut(ts.END_HUB_CLOSED, "the server's telemetry hub is shutting down")
                sub._wake_if_waiting()
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

    # ------------------------------------------------------------ subscribers
    def subscribe(self) -> Subscription:
        """A new run with a fresh 128-bit id, claimed before anyone can send frames for it.

        Must be called on the event loop that will read it. Raises HubFull.
        """
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._closing:
                raise HubFull("the server's telemetry hub is shutting down")
            if len(self._subs) >= self.limits.max_subscribers:
                raise HubFull(
                    f"{self.limits.max_subscribers} telemetry subscribers are connected, "
                    "the most this server allows"
                )
            run_id = secrets.token_bytes(16)
            while run_id in self._subs:  # pragma: no cover - 2^-128
                run_id = secrets.token_bytes(16)
            sub = Subscription(self, run_id, loop)
            self._subs[run_id] = sub
            self._counters["subscriptions"] += 1
            return sub

    def _release(self, sub: Subscription) -> None:
        # Under self._lock.
        if self._subs.get(sub.run_id) is sub:
            del self._subs[sub.run_id]

    def stats(self) -> dict[str, int]:
        """Counters, the live subscribers and the bytes they buffer now."""
        with self._lock:
            result = dict(self._counters)
            result["subscribers"] = len(self._subs)
            result["buffered_bytes"] = self._buffered
            result["served_items"] = self._served
        result["process"] = os.getpid()  # which API-server process answered
        return result

    # ------------------------------------------------------------ receiving
    def _receive_loop(self) -> None:
        sock = self._sock
        assert sock is not None
        space = socket.CMSG_SPACE(_CREDS.size)
        limit = ts.MAX_FRAME_ITEM
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        # Wake often enough to cut stalled subscribers on time.
        check_every = min(1.0, self.limits.stall_seconds / 2)
        wait_ms = int(min(0.5, check_every) * 1000) or 1
        next_check = time.monotonic() + check_every
        while not self._closing:
            batch: list[tuple[bytes, int]] = []
            try:
                if poller.poll(wait_ms):
                    # Drain what is queued: one lock and one wake-up per subscriber
                    # per batch, however many frames came.
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
            now = time.monotonic()
            if now >= next_check:
                next_check = now + check_every
                self._cut_stalled(now)

    def _route(self, batch: list[tuple[bytes, int]]) -> None:
        counters = self._counters
        touched: set[Subscription] = set()
        accept = self._accept_uids
        with self._lock:
            for data, uid in batch:
                counters["frames"] += 1
                if uid == _NOT_A_FRAME:
                    counters["rejected"] += 1
                    continue
                if uid not in accept:  # includes _NO_CREDENTIALS
                    counters["rejected_uid"] += 1
                    continue
                sub = self._subs.get(data[_RUN_ID])
                if sub is None:
                    counters["unclaimed"] += 1
                    continue
                if sub._offer(ts.frame_item(data)):
                    counters["accepted"] += 1
                else:
                    counters["dropped"] += 1
                touched.add(sub)
            for sub in touched:
                sub._wake_if_waiting()

    def _cut_stalled(self, now: float) -> None:
        stall = self.limits.stall_seconds
        with self._lock:
            for sub in list(self._subs.values()):
                if sub._end is None and now - sub.last_pull > stall:
                    sub._cut(
                        ts.END_TOO_SLOW,
                        f"the subscriber read nothing for {stall:g} s; its telemetry was discarded",
                    )
                    self._release(sub)
                    self._counters["cut_stalled"] += 1
                    log.warning(
                        "parallelhue: telemetry subscriber of run %s read nothing for %g s; "
                        "cut off (its buffer is freed)",
                        sub.run_hex,
                        stall,
                    )


def _checked(
    data: bytes, ancillary: list[tuple[int, int, bytes]], flags: int, limit: int
) -> tuple[bytes, int]:
    """(datagram, sender uid); _NOT_A_FRAME or _NO_CREDENTIALS instead of a uid."""
    if flags & socket.MSG_TRUNC or len(data) > limit or len(data) < 24 or data[:4] != _FRAME_MAGIC:
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
