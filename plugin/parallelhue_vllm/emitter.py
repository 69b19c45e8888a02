"""The bounded, non-blocking telemetry emitter shared by the plugin and the simulated engine.

The calling thread (vLLM's scheduler or output-processor loop) only appends
one item per step to a queue (a C-level `queue.SimpleQueue`, no lock held by
Python code). A daemon sender thread encodes the items into frames and sends
them over a connected AF_UNIX datagram socket per run, blocking at most
`send_timeout` (2 s by default) per frame: a momentarily full receiver (EAGAIN)
is waited for, not a loss. Only the sender thread waits, never the caller; the
wait is generous because Linux queues just `net.unix.max_dgram_qlen` (often 10)
datagrams per socket and a client busy for a moment must not lose frames.
The wait is wall time, so a process stopped through it (SIGSTOP, a long pause)
tries once more for RESUME_GRACE before it calls the client slow.

The queue is bounded twice: `queue_size` items and MAX_QUEUED_RECORDS records,
so a stalled client or a starved sender costs bounded memory. Everything that
cannot be sent (queue full, timeout, no socket, a record that cannot be
encoded) is counted per run and reported in the `dropped` field of the next
frame that is sent, so the client always sees the loss. Sequence numbers are
assigned when a frame is actually sent. Nothing here raises into the caller.
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import accelerator, inband, paths, wire
from .destination import Destination, RunSink

__all__ = ["Emitter", "encode_chunks", "encode_rows"]

log = logging.getLogger("parallelhue_vllm")

# Runs with state at the same time; the least recently used is evicted beyond
# this (a client that vanished without its requests finishing).
MAX_RUNS = 256
# After a failed socket check or send, how long a run's frames are dropped
# (and counted) before the socket is checked again.
RECHECK_SECONDS = 0.5
# After a send timed out, how long the receiver may still take to make room: the
# timeout may have passed while this process was stopped, not while the client slept.
RESUME_GRACE = 0.1
# Records waiting in the queue at most (all runs): about 26 MB of rows at most.
MAX_QUEUED_RECORDS = 65536

_ITEM_RECORDS = 0  # (item, run_id, kind, step, timestamp, records)
_ITEM_ROWS = 1  # (item, kind, step, timestamp, rows by run, row count)
_ITEM_END = 2  # (item, run_id)
_ITEM_CLOSE = 3  # (item,)
_ITEM_BEGIN = 4  # (item, run_id, stream, request_id): a request of ours, for in-band runs
_ITEM_FINISH = 5  # (item, run_id, stream, request_id, flags): this source is done with it

# The C step encoders (plugin/speedups/src/encode.c) when built (accelerator.py decides, as for
# the hooks): the same bytes and refusals as wire.py's, which stays the
# reference (tests/test_wire_speedups.py compares them on random steps).
_speedups: Any = accelerator.load()[0]
# A step's whole frame from its rows and header fields, or None when it is not one
# frame (the emitter's fast path; without the accelerator: none, wire.py's path).
_frame_encoders: dict[int, Any] = (
    {
        wire.KIND_TEXT: _speedups.encode_text_frame,
        wire.KIND_PROVENANCE: _speedups.encode_provenance_frame,
    }
    if _speedups is not None
    else {}
)


def encode_rows(kind: int, step: wire.ProvenanceStep | wire.TextStep) -> list[bytes]:
    """The bytes of each record of a provenance or text step (wire.encode_rows)."""
    if _speedups is not None:
        if kind == wire.KIND_TEXT:
            encoded: list[bytes] = _speedups.encode_text_step(*step)
            return encoded
        if kind == wire.KIND_PROVENANCE:
            encoded = _speedups.encode_provenance_step(*step)
            return encoded
    return wire.encode_rows(kind, step)


def encode_chunks(kind: int, step: wire.ProvenanceStep | wire.TextStep) -> list[tuple[int, bytes]]:
    """A step's records as frame bodies (record count, bytes), in order: one body
    unless they do not fit one frame. The C encoder writes the body at once (no
    bytes object per record, no join); a step too large for one frame is encoded
    again record by record and split (_frame_chunks): the same bytes either way."""
    if _speedups is not None and kind in (wire.KIND_TEXT, wire.KIND_PROVENANCE):
        if kind == wire.KIND_TEXT:
            body: bytes = _speedups.encode_text_body(*step)
        else:
            body = _speedups.encode_provenance_body(*step)
        records = len(step[2])  # texts / roles: one per record
        if records <= wire.MAX_RECORDS and len(body) <= wire.FRAME_RECORD_BUDGET:
            return [(records, body)]
    return _frame_chunks(encode_rows(kind, step))


@dataclass(slots=True)
class _Instance:
    """One request's own source in an in-band run: its frames go to its response only."""

    key: bytes  # vLLM's internal request id
    source_id: int
    next_seq: int = 0
    hello_sent: bool = False
    dropped: int = 0


@dataclass(slots=True)
class _RunState:
    run_bytes: bytes
    source_id: int
    # In-band (no client socket, hubs here): one source per request (docs/REACH.md).
    inband: bool = False
    instances: dict[int, _Instance] = field(default_factory=dict)  # by stream
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
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        # Queue occupancy: each counter has one writer (callers / the sender).
        self._put_items = self._put_records = 0
        self._taken_items = self._taken_records = 0
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
            if not self._admit((run_id,), len(records)):
                return False
            self._queue.put((_ITEM_RECORDS, run_id, kind, step, time.monotonic_ns(), records))
            return True
        except Exception:  # pragma: no cover - last line of defence for the engine
            return False

    def submit_rows(
        self,
        kind: int,
        step: int,
        steps_by_run: Mapping[str, wire.ProvenanceStep | wire.TextStep],
        records: int,
    ) -> bool:
        """Queue one step's rows (wire.py) of every run, `records` rows in all.

        One item per step whatever the number of runs. Never blocks or raises;
        False = dropped.
        """
        try:
            if not self._admit(steps_by_run, records):
                return False
            self._queue.put((_ITEM_ROWS, kind, step, time.monotonic_ns(), steps_by_run, records))
            return True
        except Exception:  # pragma: no cover
            return False

    def notice(self, run_id: str, stream: int, code: int, message: str) -> None:
        """Queue a notice for one stream (or wire.ALL_STREAMS) of a run."""
        record = wire.NoticeRecord(stream=stream, code=code, message=message)
        self.submit(run_id, wire.KIND_NOTICE, -1, [record])

    def begin_request(self, run_id: str, stream: int, request_id: str) -> None:
        """A request of ours arrived here: in an in-band run its records go to its own
        source, keyed by vLLM's id `request_id` (nothing to do without hubs)."""
        try:
            if self._destination.hubs is None or self._closed or os.getpid() != self._pid:
                return
            if self._thread is None:
                self._start_thread()
            self._queue.put((_ITEM_BEGIN, run_id, stream, request_id))
        except Exception:  # pragma: no cover
            pass

    def end_request(self, run_id: str, stream: int, request_id: str, refused: bool = False) -> None:
        """This source sends nothing more for the request (`refused`: the frontend
        refused it with a notice, so its response needs no provenance)."""
        try:
            if self._destination.hubs is None or self._closed or os.getpid() != self._pid:
                return
            flags = inband.FLAG_CLOSED | (inband.FLAG_REFUSED if refused else 0)
            self._queue.put((_ITEM_FINISH, run_id, stream, request_id, flags))
        except Exception:  # pragma: no cover
            pass

    def end_run(self, run_id: str) -> None:
        """Forget a run once its queued frames are sent (its socket is closed)."""
        try:
            if self._closed or os.getpid() != self._pid:
                return
            self._queue.put((_ITEM_END, run_id))
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
            self._queue.put((_ITEM_CLOSE,))
            thread.join(max(0.0, timeout))
        except Exception:  # pragma: no cover
            pass

    def stats(self) -> dict[str, int]:
        """Counters: submitted, sent (frames), dropped (frames), send_errors, runs (with state)."""
        result = dict(self._stats)
        result["runs"] = len(self._runs)
        return result

    # ---------------------------------------------------------------- internals
    def _admit(self, runs: Any, records: int) -> bool:
        """Count a data item in, or count it as dropped when the queue is full."""
        if os.getpid() != self._pid:
            self._reset_process_state()
        if self._closed:
            return False
        stats = self._stats
        stats["submitted"] += len(runs)
        if self._thread is None:
            self._start_thread()
        if (
            self._put_items - self._taken_items >= self._queue_size
            or self._put_records - self._taken_records + records > MAX_QUEUED_RECORDS
        ):
            with self._drop_lock:
                drops = self._queue_drops
                if len(drops) > MAX_RUNS:
                    drops.clear()  # bounded; runs long gone
                for run_id in runs:
                    drops[run_id] = drops.get(run_id, 0) + 1
                stats["dropped"] += len(runs)
            return False
        self._put_items += 1
        self._put_records += records
        return True

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
            item = get()
            if item[0] == _ITEM_CLOSE:
                for state in self._runs.values():
                    _close_sock(state)
                self._runs.clear()
                return
            try:
                self.process(item)
            except Exception as error:  # never let the thread die
                self._stats["send_errors"] += 1
                log.debug("parallelhue: emitter error: %r", error)

    def process(self, item: tuple[Any, ...]) -> None:
        """Encode and send one queued item (the sender thread's work; benches call it too)."""
        what = item[0]
        if what == _ITEM_ROWS:
            _, kind, step, timestamp, rows_by_run, count = item
            self._taken_items += 1
            self._taken_records += count
            encode_frame = _frame_encoders.get(kind)
            runs = self._runs
            for run_id, rows in rows_by_run.items():
                # The common step: a run already connected and greeted, no queue drops
                # to report, one frame: the C encoder writes the frame whole (the
                # bytes of _send_records' path below, which takes everything else).
                state = runs.get(run_id)
                if state is not None and state.inband and state.sock is not None:
                    try:
                        self._send_records(run_id, kind, step, timestamp, encode_rows(kind, rows))
                    except Exception as error:
                        self._encoding_failed(run_id, error)
                    continue
                if (
                    encode_frame is not None
                    and state is not None
                    and state.hello_sent
                    and state.sock is not None
                    and not state.inband
                    and not self._queue_drops
                    and step >= 0
                ):
                    try:
                        frame = encode_frame(
                            state.run_bytes, state.source_id, state.next_seq, step, timestamp,
                            state.dropped, *rows,
                        )  # fmt: skip
                    except Exception as error:
                        self._encoding_failed(run_id, error)
                        continue
                    if frame is not None:
                        runs.move_to_end(run_id)
                        state.last_step = step
                        self._send_frame(state, frame)
                        continue
                try:
                    self._send_records(run_id, kind, step, timestamp, encode_rows(kind, rows))
                except Exception as error:
                    self._encoding_failed(run_id, error)
                    continue
        elif what == _ITEM_RECORDS:
            _, run_id, kind, step, timestamp, records = item
            self._taken_items += 1
            self._taken_records += len(records)
            try:
                encoded = [wire.encode_record(kind, record) for record in records]
                self._send_records(run_id, kind, step, timestamp, encoded)
            except Exception as error:
                self._encoding_failed(run_id, error)
        elif what == _ITEM_BEGIN:
            _, run_id, stream, request_id = item
            state = self._run_state(run_id)
            if state is not None:
                key = request_id.encode("utf-8", "surrogateescape")
                state.instances[stream] = _Instance(key, secrets.randbits(64) or 1)
        elif what == _ITEM_FINISH:
            _, run_id, stream, request_id, flags = item
            state = self._runs.get(run_id)
            if state is None or not state.inband or state.sock is None:
                return
            instance = state.instances.get(stream)
            if instance is None or instance.key != request_id.encode("utf-8", "surrogateescape"):
                return
            del state.instances[stream]
            envelope = inband.Envelope(instance.key, self._hello.role, flags, 0, b"")
            self._send_envelopes(state, [envelope])
        elif what == _ITEM_END:
            run_id = item[1]
            if run_id in self._runs:
                _close_sock(self._runs.pop(run_id))
            # Queue drops of this run stay pending: a later source of the same
            # run reports them, so the loss stays visible.

    def _encoding_failed(self, run_id: str, error: Exception) -> None:
        """A step the encoder refused (or too large a record) is a lost frame: counted,
        reported by the next one."""
        self._stats["send_errors"] += 1
        log.debug("parallelhue: emitter could not encode a frame: %r", error)
        state = self._run_state(run_id)
        if state is not None:
            self._count_drops(state, 1)

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
        self, run_id: str, kind: int, step: int, timestamp: int, records: list[bytes]
    ) -> None:
        """One step's encoded records of a run: as the run's frames to the client's
        socket, or, in-band, as each request's own frames to the hubs."""
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
        if not self._connect(state, run_id):
            self._count_drops(state, 1)
            return
        if state.inband:
            self._send_inband(state, kind, step, timestamp, records)
            return
        chunks = _frame_chunks(records)
        if not state.hello_sent:
            header = wire.Header(state.run_bytes, state.source_id, 0, step, timestamp, 0)
            if not self._send(state, wire.encode_hello(header, self._hello)):
                self._count_drops(state, len(chunks))
                return
            state.hello_sent = True
            state.next_seq = 1
        for count, body in chunks:
            header = wire.Header(
                state.run_bytes,
                state.source_id,
                state.next_seq,
                step,
                timestamp,
                min(state.dropped, 0xFFFFFFFF),
            )
            self._send_frame(state, wire.encode_joined_frame(kind, header, count, body))

    def _send_frame(self, state: _RunState, frame: bytes) -> None:
        """One data frame sent with the run's next sequence number: on success the
        next one, else a lost frame that the next frame reports as dropped."""
        if self._send(state, frame):
            state.next_seq += 1
            state.dropped = 0
        else:
            self._count_drops(state, 1)

    def _send_inband(
        self, state: _RunState, kind: int, step: int, timestamp: int, records: list[bytes]
    ) -> None:
        """Each request's records as frames of its own source, in envelopes keyed by
        its vLLM id (inband.py); a notice for the whole run goes to every request."""
        by_stream: dict[int, list[bytes]] = {}
        for record in records:
            by_stream.setdefault(record[0] | record[1] << 8, []).append(record)
        if state.dropped:
            # Queue drops of the run: every request of it reports them.
            for instance in state.instances.values():
                instance.dropped += state.dropped
            state.dropped = 0
        role = self._hello.role
        extents = kind in (wire.KIND_PROVENANCE, wire.KIND_TEXT)
        envelopes: list[inband.Envelope] = []
        for stream, own in by_stream.items():
            if stream == wire.ALL_STREAMS:
                targets = list(state.instances.values())
            else:
                found = state.instances.get(stream)
                targets = [found] if found is not None else []
            if not targets:
                self._stats["unrouted"] = self._stats.get("unrouted", 0) + len(own)
                continue
            flags = end_tokens = 0
            if extents:
                for record in own:
                    _, end, finished = inband.record_extent(record)
                    end_tokens = max(end_tokens, end)
                    if finished:
                        flags |= inband.FLAG_FINISHED
            chunks = _frame_chunks(own)
            for instance in targets:
                if not instance.hello_sent:
                    header = wire.Header(state.run_bytes, instance.source_id, 0, step, timestamp, 0)
                    hello = wire.encode_hello(header, self._hello)
                    envelopes.append(inband.Envelope(instance.key, role, 0, 0, hello))
                    instance.hello_sent = True
                    instance.next_seq = 1
                for count, body in chunks:
                    header = wire.Header(
                        state.run_bytes,
                        instance.source_id,
                        instance.next_seq,
                        step,
                        timestamp,
                        min(instance.dropped, 0xFFFFFFFF),
                    )
                    frame = wire.encode_joined_frame(kind, header, count, body)
                    envelopes.append(inband.Envelope(instance.key, role, flags, end_tokens, frame))
                    instance.next_seq += 1
                    instance.dropped = 0
        if envelopes:
            self._send_envelopes(state, envelopes)

    def _send_envelopes(self, state: _RunState, envelopes: list[inband.Envelope]) -> None:
        """To every hub; a datagram no hub took is lost after its frames were numbered:
        the client sees a sequence gap, or the response's end says what is missing."""
        sink = state.sock
        if sink is None:
            return
        for datagram in inband.encode_envelopes(envelopes):
            if sink.send_envelopes(datagram):
                self._stats["sent"] += 1
            else:
                self._stats["send_errors"] += 1
                with self._drop_lock:
                    self._stats["dropped"] += 1

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
        state.inband = sock.inband
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
                # The timeout is wall time: a process stopped or starved through it (SIGSTOP,
                # a long pause) wakes past its deadline although the client read all along.
                # Only a receiver still full for a moment after we run again is slow.
                if _send_after_pause(sock, frame):
                    self._stats["sent"] += 1
                    return True
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


def _send_after_pause(sock: Any, frame: bytes) -> bool:
    """Send `frame` if the receiver has room within RESUME_GRACE of trying again."""
    until = time.monotonic() + RESUME_GRACE
    while True:
        try:
            sock.send(frame, socket.MSG_DONTWAIT)
            return True
        except OSError as error:
            if error.errno not in (errno.EAGAIN, errno.ENOBUFS) or time.monotonic() >= until:
                return False
            time.sleep(0.001)


def _frame_chunks(encoded: list[bytes]) -> list[tuple[int, bytes]]:
    """Encoded records joined into frame bodies (bytes and record count); order kept.

    One frame per step and run unless the records do not fit one.
    """
    budget = wire.FRAME_RECORD_BUDGET
    body = b"".join(encoded)
    if len(encoded) <= wire.MAX_RECORDS and len(body) <= budget:
        return [(len(encoded), body)]
    chunks: list[tuple[int, bytes]] = []
    current: list[bytes] = []
    used = 0
    for record in encoded:
        size = len(record)
        if size > budget:
            raise ValueError(f"a record of {size} bytes, a frame holds {budget}")
        if current and (used + size > budget or len(current) == wire.MAX_RECORDS):
            chunks.append((len(current), b"".join(current)))
            current = []
            used = 0
        current.append(record)
        used += size
    if current:
        chunks.append((len(current), b"".join(current)))
    return chunks


def _close_sock(state: _RunState) -> None:
    if state.sock is not None:
        try:
            state.sock.close()
        except OSError:  # pragma: no cover
            pass
        state.sock = None
