"""Fault injection for the simulated engine, applied at the sending side.

Content faults change one record or one SSE chunk before it is sent (the
emitter then encodes and sequences it normally). Datagram faults act on
encoded, sequenced frames in a proxy that sits between the emitters and the
client's socket: the emitters send to `<proxy dir>/<run>.sock`, the proxy
forwards to `<client dir>/<run>.sock`, dropping, duplicating, reordering,
delaying, truncating, oversizing or re-addressing frames on the way. The
emitter itself is not changed. A sender with another uid is a forked child
that connects as root and drops to uid 65534 before sending a forged frame.
"""

from __future__ import annotations

import heapq
import logging
import os
import random
import secrets
import selectors
import socket
import tempfile
import threading
import time
from dataclasses import replace

from parallelhue_vllm import paths, wire

from .config import FaultConfig
from .engine import ContentFaultHook, SimRequest

__all__ = ["ContentFaults", "FaultProxy", "send_as_other_uid"]

log = logging.getLogger("parallelhue.sim")

NOBODY_UID = 65534
_HEADER_SEQ = slice(32, 40)
_RUN_ID = slice(8, 24)
_KIND = 5
HOLD_SECONDS = 0.05
# Characters a simulated reasoning parser moves out of `content`.
REASONING_CHARS = 24


def _flip_ascii(data: str) -> str | None:
    """Change one ASCII letter or digit to a neighbour: exactly one byte differs."""
    for index, char in enumerate(data):
        if char.isascii() and char.isalnum():
            changed = chr(ord(char) ^ 1)
            if changed.isascii() and changed.isalnum():
                return data[:index] + changed + data[index + 1 :]
    return None


class ContentFaults(ContentFaultHook):
    """One-shot content faults on `target_stream` (see FaultConfig)."""

    def __init__(self, config: FaultConfig) -> None:
        self.config = config
        self.fired: dict[str, int] = {}
        self._pending_reasoning = 0

    def _due(self, name: str, request: SimRequest, offset: int) -> bool:
        config = self.config
        return (
            bool(getattr(config, name))
            and name not in self.fired
            and request.stream == config.target_stream
            and offset >= config.target_offset
        )

    def _fire(self, name: str) -> None:
        self.fired[name] = self.fired.get(name, 0) + 1
        log.info("SIMULATED fault injected: %s", name.replace("_", "-"))

    def provenance(
        self, request: SimRequest, record: wire.ProvenanceRecord
    ) -> wire.ProvenanceRecord:
        if self._due("frame_token_id", request, record.offset):
            self._fire("frame_token_id")
            token_ids = list(record.token_ids)
            token_ids[0] = token_ids[0] + 1
            return replace(record, token_ids=token_ids)
        return record

    def text(self, request: SimRequest, record: wire.TextRecord) -> wire.TextRecord:
        if self._due("fragment_byte", request, record.offset):
            for index, token in enumerate(record.tokens):
                if not token.fragment:
                    continue
                changed = _flip_ascii(token.fragment.decode("utf-8"))
                if changed is None:
                    continue
                self._fire("fragment_byte")
                tokens = list(record.tokens)
                tokens[index] = replace(token, fragment=changed.encode("utf-8"))
                return replace(record, tokens=tokens)
        return record

    def sse(
        self, request: SimRequest, text: str, token_ids: list[int]
    ) -> tuple[str, list[int], str]:
        # The collector's offset of this chunk's first token.
        offset = request.text_offset - len(token_ids)
        reasoning = ""
        config = self.config
        if config.reasoning and request.stream == config.target_stream:
            # A reasoning parser moves the opening text into reasoning_content.
            if "reasoning" not in self.fired:
                self._fire("reasoning")
                self._pending_reasoning = REASONING_CHARS
            if self._pending_reasoning:
                reasoning = text[: self._pending_reasoning]
                text = text[self._pending_reasoning :]
                self._pending_reasoning -= len(reasoning)
        if self._due("sse_byte", request, offset):
            changed = _flip_ascii(text)
            if changed is not None:
                self._fire("sse_byte")
                text = changed
        if token_ids and self._due("sse_token_id", request, offset):
            self._fire("sse_token_id")
            token_ids = [token_ids[0] + 1, *token_ids[1:]]
        return text, token_ids, reasoning


class FaultProxy:
    """Forward a run's datagrams from the emitters to the client, with faults.

    One thread, one bound socket per run in a private directory. Counters in
    `stats` say what was done, so tests can check that a fault really fired.
    """

    def __init__(self, config: FaultConfig, target_dir: str | None) -> None:
        self.config = config
        self.target_dir = target_dir
        self.proxy_dir = tempfile.mkdtemp(prefix="phsim-")
        os.chmod(self.proxy_dir, 0o700)
        self.rng = random.Random(config.seed)
        self.stats: dict[str, int] = {
            "forwarded": 0,
            "drop": 0,
            "duplicate": 0,
            "reorder": 0,
            "truncate": 0,
            "oversize": 0,
            "foreign_run": 0,
            "delay": 0,
        }
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._runs: dict[str, tuple[socket.socket, str]] = {}
        self._out: dict[str, socket.socket] = {}
        self._data_frames: dict[bytes, int] = {}  # per source id
        # reorder: a frame waiting for the run's next one (or HOLD_SECONDS at most)
        self._held: dict[str, bytes] = {}
        self._held_since: dict[str, float] = {}
        self._delayed: list[tuple[float, int, str, bytes]] = []
        self._counter = 0
        self._stop = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._loop, name="phsim-faults", daemon=True)
        self._thread.start()

    def add_run(self, run_id: str) -> None:
        """Bind the run's proxy socket (before the emitters first send to it)."""
        with self._lock:
            if run_id in self._runs:
                return
            path = paths.socket_path(self.proxy_dir, run_id)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
            sock.bind(path)
            os.chmod(path, 0o600)
            sock.setblocking(False)
            self._runs[run_id] = (sock, path)
            self._selector.register(sock, selectors.EVENT_READ, run_id)
        self._wake_w.send(b"x")

    def close(self) -> None:
        self._stop = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(2.0)
        for sock, path in self._runs.values():
            sock.close()
            try:
                os.unlink(path)
            except OSError:
                pass
        for out in self._out.values():
            out.close()
        self._wake_r.close()
        self._wake_w.close()
        try:
            os.rmdir(self.proxy_dir)
        except OSError:
            pass

    # ------------------------------------------------------------------ thread
    def _loop(self) -> None:
        while not self._stop:
            timeout = None
            if self._delayed:
                timeout = max(0.0, self._delayed[0][0] - time.monotonic())
            if self._held:
                timeout = HOLD_SECONDS if timeout is None else min(timeout, HOLD_SECONDS)
            for key, _ in self._selector.select(timeout):
                if key.data is None:
                    try:
                        self._wake_r.recv(4096)
                    except BlockingIOError:
                        pass
                    continue
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                while True:
                    try:
                        frame = sock.recv(1 << 17)
                    except BlockingIOError:
                        break
                    except OSError:
                        break
                    self._handle(key.data, frame)
            now = time.monotonic()
            for run_id, since in list(self._held_since.items()):
                if now - since >= HOLD_SECONDS:
                    self._deliver_held(run_id)
            while self._delayed and self._delayed[0][0] <= now:
                _, _, run_id, frame = heapq.heappop(self._delayed)
                self._send(run_id, frame)
        # Flush what is still held or delayed: faults decide losses, not shutdown.
        for run_id, frame in list(self._held.items()):
            self._send(run_id, frame)
        for _, _, run_id, frame in sorted(self._delayed):
            self._send(run_id, frame)

    def _chance(self, name: str, probability: float) -> bool:
        if probability <= 0.0:
            return False
        limit = self.config.max_per_fault
        if limit and self.stats[name] >= limit:
            return False
        if self.rng.random() < probability:
            self.stats[name] += 1
            log.info("SIMULATED fault injected: %s", name.replace("_", "-"))
            return True
        return False

    def _handle(self, run_id: str, frame: bytes) -> None:
        config = self.config
        if len(frame) < wire.HEADER_SIZE or frame[_KIND] == wire.KIND_HELLO:
            self._deliver(run_id, frame)
            return
        source = frame[24:32]
        index = self._data_frames.get(source, 0)
        self._data_frames[source] = index + 1
        if index < config.skip_frames:
            self._deliver(run_id, frame)
            return
        if self._chance("drop", config.drop):
            return
        if self._chance("truncate", config.truncate):
            frame = frame[: wire.HEADER_SIZE - 8]
        elif self._chance("oversize", config.oversize):
            frame = frame + bytes(wire.MAX_FRAME_BYTES + 1 - len(frame))
        if self._chance("foreign_run", config.foreign_run):
            other_run = secrets.token_bytes(16)
            self._deliver(run_id, frame[: _RUN_ID.start] + other_run + frame[_RUN_ID.stop :])
        if self._chance("reorder", config.reorder) and run_id not in self._held:
            self._held[run_id] = frame
            self._held_since[run_id] = time.monotonic()
            return
        self._deliver(run_id, frame)
        if self._chance("duplicate", config.duplicate):
            self._deliver(run_id, frame)

    def _deliver(self, run_id: str, frame: bytes) -> None:
        """Send now, or after the configured delay; release a held (reordered) frame after."""
        held = self._held.pop(run_id, None)
        self._held_since.pop(run_id, None)
        if self.config.delay_ms > 0:
            self.stats["delay"] += 1
            release = time.monotonic() + self.config.delay_ms / 1000.0
            for item in (frame, held):
                if item is not None:
                    self._counter += 1
                    heapq.heappush(self._delayed, (release, self._counter, run_id, item))
            return
        self._send(run_id, frame)
        if held is not None:
            self._send(run_id, held)

    def _deliver_held(self, run_id: str) -> None:
        frame = self._held.pop(run_id)
        self._held_since.pop(run_id, None)
        self._send(run_id, frame)

    def _send(self, run_id: str, frame: bytes) -> None:
        out = self._out.get(run_id)
        if out is None:
            if self.target_dir is None:
                return
            try:
                path = paths.socket_path(self.target_dir, run_id)
                out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                out.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
                out.settimeout(1.0)
                out.connect(path)
            except (OSError, paths.SocketPathError) as error:
                log.warning("SIMULATED fault proxy cannot reach the client: %s", error)
                return
            self._out[run_id] = out
        try:
            out.send(frame)
            self.stats["forwarded"] += 1
        except OSError as error:
            log.warning("SIMULATED fault proxy send failed: %s", error)


def send_as_other_uid(socket_file: str, frames: list[bytes]) -> str:
    """Send frames to `socket_file` from a child that runs as uid 65534.

    The child connects while still root (the socket is 0600), then drops to
    nobody before sending, so the receiver sees uid 65534 in the datagram's
    credentials. Returns "sent", or why it could not ("needs root", an error).
    """
    if os.geteuid() != 0:
        return "needs root"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no Python-level cleanup, only the send
        status = 1
        try:
            os.close(read_end)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.connect(socket_file)
            os.setgroups([])
            os.setgid(NOBODY_UID)
            os.setuid(NOBODY_UID)
            for frame in frames:
                sock.send(frame)
            os.write(write_end, b"sent")
            status = 0
        except BaseException as error:
            try:
                os.write(write_end, f"error: {error}".encode()[:200])
            except OSError:
                pass
        finally:
            os._exit(status)
    os.close(write_end)
    try:
        message = os.read(read_end, 256).decode("utf-8", "replace")
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    return message or "error: child sent nothing"
