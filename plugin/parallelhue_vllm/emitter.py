"""The bounded, non-blocking telemetry emitter shared by the plugin and the simulated engine.

The calling thread (vLLM's scheduler or output-processor loop) only appends to
a bounded queue. A daemon sender thread encodes frames and sends them over a
connected AF_UNIX datagram socket per run, blocking at most `send_timeout`
(2 s by default) per frame: a momentarily full receiver (EAGAIN) is waited
for, not a loss. Only the sender thread waits, never the caller; the wait is
generous because Linux queues just `net.unix.max_dgram_qlen` (often 10)
datagrams per socket and a client busy for a moment must not lose frames.
Everything that cannot be sent (queue full, timeout, no socket) is counted
per run and reported in the `dropped` field of the next frame that is sent,
so the client always sees the loss. Sequence numbers are assigned when a
frame is actually sent. Nothing here raises into the caller.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import queue
import secrets
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from . import paths, wire
from .destination import Destination, RunSink

__all__ = ["Emitter"]

log = logging.getLogger("parallelhue_vllm")

# Runs with state at the same time; the least recently used is evicted beyond
# this (a client that vanished without its requests finishing).
MAX_RUNS = 256
# After a failed socket check or send, how long a run's frames are dropped
# (and counted) before the socket is checked again.
RECHECK_SECONDS = 0.5

_ITEM_RECORDS = 0
_ITEM_END = 1
_ITEM_CLOSE = 2


@dataclass(slots=True)
class _RunState:
    run_bytes: bytes
    source_id: int
    next_seq: int = 0
    hello_sent: bool = False
    dropped: int = 0  # frames lost since the previous sent frame
    last_step: int = 0
    sock: RunSink | None = None
    retry_at: float = 0.0
    warned: bool = False
    send_warned: bool = False
    slow_until: float = 0.0
    path: str = ""


class Emitter:
    """Queue frames from hot loops; send them from one background thread."""

    def __init__(
        self,
        *,
        role: int,
        engine: int,
        engine_version: str,
        plugin_version: str,
        spec_method: str,
        num_speculative_tokens: int,
        role_derivation: int,
        async_scheduling: bool,
        verification: int | None = None,
        socket_dir: str | None = None,
        queue_size: int = 8192,
        send_timeout: float = 2.0,
        destination: Destination | None = None,
    ) -> None:
        self._hello = wire.Hello(
            role=role,
            engine=engine,
            role_derivation=role_derivation,
            async_scheduling=async_scheduling,
            num_speculative_tokens=num_speculative_tokens,
            plugin_version=plugin_version,
            engine_version=engine_version,
            spec_method=spec_method,
            # Unknown unless told; none without speculative decoding (protocol 2).
            verification=(
                verification
                if verification is not None
                else (wire.VERIFICATION_UNKNOWN if spec_method else wire.VERIFICATION_NONE)
            ),
        )
        self._queue_size = queue_size
        self._send_timeout = send_timeout
        # Where frames go (the client's socket, this server's hubs): destination.py.
        self._destination = destination or Destination(socket_dir, send_timeout)
        self._start_lock = threading.Lock()
        self._drop_lock = threading.Lock()
        self._reset_process_state()

    def _reset_process_state(self) -> None:
        # Also called after fork: the sender thread and the sockets stay in the parent.
        self._pid = os.getpid()
        self._queue: queue.Queue[tuple[int, str, int, int, int, list[wire.Record]]] = queue.Queue(
            self._queue_size
        )
        self._thread: threading.Thread | None = None
        self._closed = False
        # Drops at enqueue time, per run; moved into the run state by the sender.
        self._queue_drops: dict[str, int] = {}
        self._runs: collections.OrderedDict[str, _RunState] = collections.OrderedDict()
        self._stats = {"submitted": 0, "sent": 0, "dropped": 0, "send_errors": 0}

    # ----------------------------------------------------------------- callers
    def submit(self, run_id: str, kind: int, step: int, records: list[wire.Record]) -> bool:
        """Queue one step's records of one run. Never blocks or raises; False = dropped."""
        try:
            return self._enqueue(_ITEM_RECORDS, run_id, kind, step, records)
        except Exception:  # pragma: no cover - last line of defence for the engine
            return False

    def notice(self, run_id: str, stream: int, code: int, message: str) -> None:
        """Queue a notice for one stream (or wire.ALL_STREAMS) of a run."""
        try:
            record = wire.NoticeRecord(stream=stream, code=code, message=message)
            self._enqueue(_ITEM_RECORDS, run_id, wire.KIND_NOTICE, -1, [record])
        except Exception:  # pragma: no cover
            pass

    def end_run(self, run_id: str) -> None:
        """Forget a run once its queued frames are sent (its socket is closed)."""
        try:
            self._enqueue(_ITEM_END, run_id, 0, 0, [])
        except Exception:  # pragma: no cover
            pass

    def close(self, timeout: float = 1.0) -> None:
        """Send what is queued (up to `timeout`), then stop the sender thread."""
        try:
            if os.getpid() != self._pid or self._closed:
                return
            self._closed = True
            thread = self._thread
            if thread is None:
                return
            deadline = time.monotonic() + timeout
            while True:
                try:
                    self._queue.put((_ITEM_CLOSE, "", 0, 0, 0, []), timeout=0.05)
                    break
                except queue.Full:
                    if time.monotonic() >= deadline:
                        break
            thread.join(max(0.0, deadline - time.monotonic()))
        except Exception:  # pragma: no cover
            pass

    def stats(self) -> dict[str, int]:
        """Counters: submitted, sent (frames), dropped (frames), send_errors, runs (with state)."""
        result = dict(self._stats)
        result["runs"] = len(self._runs)
        return result

    # ---------------------------------------------------------------- internals
    def _enqueue(
        self, item: int, run_id: str, kind: int, step: int, records: list[wire.Record]
    ) -> bool:
        if os.getpid() != self._pid:
            self._reset_process_state()
        if self._closed:
            return False
        if item == _ITEM_RECORDS:
            self._stats["submitted"] += 1
        if self._thread is None:
            self._start_thread()
        try:
            self._queue.put_nowait((item, run_id, kind, step, time.monotonic_ns(), records))
            return True
        except queue.Full:
            if item == _ITEM_RECORDS:
                with self._drop_lock:
                    if len(self._queue_drops) > MAX_RUNS:
                        self._queue_drops.clear()  # bounded; runs long gone
                    self._queue_drops[run_id] = self._queue_drops.get(run_id, 0) + 1
                    self._stats["dropped"] += 1
            return False

    def _start_thread(self) -> None:
        with self._start_lock:
            if self._thread is None:
                thread = threading.Thread(
                    target=self._sender_loop, name="parallelhue-emitter", daemon=True
                )
                thread.start()
                self._thread = thread

    def _sender_loop(self) -> None:
        get = self._queue.get
        while True:
            item, run_id, kind, step, timestamp, records = get()
            try:
                if item == _ITEM_CLOSE:
                    for state in self._runs.values():
                        _close_sock(state)
                    self._runs.clear()
                    return
                if item == _ITEM_END:
                    if run_id in self._runs:
                        _close_sock(self._runs.pop(run_id))
                    # Queue drops of this run stay pending: a later source of the
                    # same run reports them, so the loss stays visible.
                    continue
                self._send_records(run_id, kind, step, timestamp, records)
            except Exception as error:  # never let the thread die
                self._stats["send_errors"] += 1
                log.debug("parallelhue: emitter error: %r", error)

    def _run_state(self, run_id: str) -> _RunState | None:
        state = self._runs.get(run_id)
        if state is not None:
            self._runs.move_to_end(run_id)
            return state
        try:
            run_bytes = bytes.fromhex(run_id)
        except ValueError:
            return None
        if len(run_bytes) != 16:
            return None
        state = _RunState(run_bytes=run_bytes, source_id=secrets.randbits(64) or 1)
        self._runs[run_id] = state
        while len(self._runs) > MAX_RUNS:
            _, evicted = self._runs.popitem(last=False)
            _close_sock(evicted)
        return state

    def _send_records(
        self, run_id: str, kind: int, step: int, timestamp: int, records: Sequence[wire.Record]
    ) -> None:
        state = self._run_state(run_id)
        if state is None:
            return
        if self._queue_drops:
            with self._drop_lock:
                state.dropped += self._queue_drops.pop(run_id, 0)
        if step < 0:
            step = state.last_step  # notices carry the sender's current step
        else:
            state.last_step = step
        chunks = wire.split_for_frames(kind, records) if len(records) > 1 else [list(records)]
        if not self._connect(state, run_id):
            self._count_drops(state, len(chunks))
            return
        if not state.hello_sent:
            header = wire.Header(state.run_bytes, state.source_id, 0, step, timestamp, 0)
            if not self._send(state, wire.encode_hello(header, self._hello)):
                self._count_drops(state, len(chunks))
                return
            state.hello_sent = True
            state.next_seq = 1
        for chunk in chunks:
            header = wire.Header(
                state.run_bytes,
                state.source_id,
                state.next_seq,
                step,
                timestamp,
                min(state.dropped, 0xFFFFFFFF),
            )
            frame = wire.encode_records(kind, header, chunk)
            if self._send(state, frame):
                state.next_seq += 1
                state.dropped = 0
            else:
                self._count_drops(state, 1)

    def _count_drops(self, state: _RunState, frames: int) -> None:
        state.dropped += frames
        with self._drop_lock:
            self._stats["dropped"] += frames

    def _connect(self, state: _RunState, run_id: str) -> bool:
        if state.sock is not None:
            return True
        now = time.monotonic()
        if now < state.retry_at:
            return False
        try:
            sock = self._destination.open(run_id)
        except (paths.SocketPathError, OSError) as error:
            state.retry_at = now + RECHECK_SECONDS
            if not state.warned:
                state.warned = True
                log.warning("parallelhue: telemetry for run %s not sent: %s", run_id, error)
            return False
        state.sock = sock
        state.path = sock.path
        return True

    def _send(self, state: _RunState, frame: bytes) -> bool:
        sock = state.sock
        if sock is None:
            return False
        now = time.monotonic()
        if now < state.slow_until:
            # This run's client recently stalled a whole timeout: do not let it hold
            # up other runs' frames; try without waiting until the period ends.
            try:
                sock.send(frame, socket.MSG_DONTWAIT)
            except OSError:
                return False
            self._stats["sent"] += 1
            return True
        deadline = now + self._send_timeout
        while True:
            try:
                sock.send(frame)
                self._stats["sent"] += 1
                return True
            except TimeoutError:
                # The receiver stayed full for the whole timeout.
                state.slow_until = time.monotonic() + RECHECK_SECONDS
                self._warn_send(state, f"the client did not read for {self._send_timeout:g} s")
                return False
            except OSError as error:
                if error.errno in (errno.EAGAIN, errno.ENOBUFS) and time.monotonic() < deadline:
                    time.sleep(0.001)
                    continue
                self._stats["send_errors"] += 1
                self._warn_send(state, error.strerror or str(error))
                # The client went away or re-bound: check the socket again later.
                _close_sock(state)
                state.retry_at = time.monotonic() + RECHECK_SECONDS
                return False

    def _warn_send(self, state: _RunState, reason: str) -> None:
        if not state.send_warned:
            state.send_warned = True
            log.warning(
                "parallelhue: telemetry frames for run %s dropped (%s); the client is told",
                state.run_bytes.hex(),
                reason,
            )


def _close_sock(state: _RunState) -> None:
    if state.sock is not None:
        try:
            state.sock.close()
        except OSError:  # pragma: no cover
            pass
        state.sock = None
