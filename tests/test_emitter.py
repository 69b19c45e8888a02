"""The bounded, non-blocking emitter (plugin/parallelhue_vllm/emitter.py), with a real socket."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from parallelhue.reference import decode_frame
from parallelhue.reference.decode import Frame
from parallelhue_vllm import emitter as emitter_module
from parallelhue_vllm import wire
from parallelhue_vllm.emitter import Emitter

RUN = "0123456789abcdef0123456789abcdef"
OTHER_RUN = "fedcba9876543210fedcba9876543210"


class Receiver:
    """The client's end: a 0600 datagram socket in a 0700 directory."""

    def __init__(self, directory: Path, run_id: str = RUN) -> None:
        self.path = directory / f"{run_id}.sock"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        os.chmod(self.path, 0o600)

    def read_all(self) -> list[Frame]:
        frames = []
        self.sock.setblocking(False)
        while True:
            try:
                frames.append(decode_frame(self.sock.recv(1 << 17)))
            except BlockingIOError:
                return frames

    def read(self, count: int, timeout: float = 10.0) -> list[Frame]:
        self.sock.settimeout(timeout)
        return [decode_frame(self.sock.recv(1 << 17)) for _ in range(count)]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="phe", dir="/tmp") as name:
        os.chmod(name, 0o700)
        yield Path(name)


def make_emitter(sock_dir: Path, **overrides: object) -> Emitter:
    options: dict[str, object] = {
        "role": wire.SOURCE_SCHEDULER,
        "engine": wire.ENGINE_VLLM,
        "engine_version": "0.32.0+cpu",
        "plugin_version": "0.1.0",
        "spec_method": "ngram",
        "num_speculative_tokens": 3,
        "role_derivation": wire.DERIVATION_DRAFT_IDS,
        "async_scheduling": False,
        "socket_dir": str(sock_dir),
    }
    options.update(overrides)
    return Emitter(**options)  # type: ignore[arg-type]


def prov(stream: int, offset: int, tokens: int = 1) -> wire.ProvenanceRecord:
    if tokens == 1:
        return wire.ProvenanceRecord(stream, offset, [7], [wire.ROLE_PLAIN], 0)
    roles = [wire.ROLE_ACCEPTED] * (tokens - 1) + [wire.ROLE_BONUS]
    return wire.ProvenanceRecord(stream, offset, list(range(tokens)), roles, tokens - 1)


def test_no_thread_or_socket_until_first_submit(sock_dir: Path) -> None:
    emitter = make_emitter(sock_dir)
    names = {thread.name for thread in threading.enumerate()}
    assert "parallelhue-emitter" not in names
    assert emitter.stats() == {"submitted": 0, "sent": 0, "dropped": 0, "send_errors": 0, "runs": 0}
    emitter.close()


def test_import_opens_no_socket_and_starts_no_thread() -> None:
    code = (
        "import threading, gc, socket\n"
        "import parallelhue_vllm.emitter, parallelhue_vllm.plugin\n"
        "socks = [o for o in gc.get_objects() if isinstance(o, socket.socket)]\n"
        "print(len(socks), threading.active_count())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["0", "1"]


def test_hello_first_then_consecutive_sequence(sock_dir: Path) -> None:
    receiver = Receiver(sock_dir)
    emitter = make_emitter(sock_dir)
    for step in range(5):
        assert emitter.submit(RUN, wire.KIND_PROVENANCE, 100 + step, [prov(0, step)])
    emitter.close(5.0)
    frames = receiver.read_all()
    assert [frame.kind for frame in frames] == [wire.KIND_HELLO] + [wire.KIND_PROVENANCE] * 5
    assert [frame.header.seq for frame in frames] == list(range(6))
    assert [frame.header.step for frame in frames] == [100, *range(100, 105)]
    assert {frame.header.source_id for frame in frames} != {0}
    assert len({frame.header.source_id for frame in frames}) == 1
    assert all(frame.header.run_id == bytes.fromhex(RUN) for frame in frames)
    assert all(frame.header.dropped == 0 for frame in frames)
    hello = frames[0].hello
    assert hello == wire.Hello(
        wire.SOURCE_SCHEDULER, wire.ENGINE_VLLM, wire.DERIVATION_DRAFT_IDS, False, 3,
        "0.1.0", "0.32.0+cpu", "ngram", wire.VERIFICATION_UNKNOWN,
    )  # fmt: skip
    assert [frame.records[0].offset for frame in frames[1:]] == list(range(5))
    assert emitter.stats()["sent"] == 6
    receiver.close()


def test_each_run_gets_its_own_source_and_hello(sock_dir: Path) -> None:
    first, second = Receiver(sock_dir, RUN), Receiver(sock_dir, OTHER_RUN)
    emitter = make_emitter(sock_dir)
    emitter.submit(RUN, wire.KIND_PROVENANCE, 1, [prov(0, 0)])
    emitter.submit(OTHER_RUN, wire.KIND_PROVENANCE, 1, [prov(0, 0)])
    emitter.close(5.0)
    frames_a, frames_b = first.read_all(), second.read_all()
    assert [f.kind for f in frames_a] == [wire.KIND_HELLO, wire.KIND_PROVENANCE]
    assert [f.kind for f in frames_b] == [wire.KIND_HELLO, wire.KIND_PROVENANCE]
    assert frames_a[0].header.source_id != frames_b[0].header.source_id
    first.close()
    second.close()


def test_queue_full_drops_are_counted_and_reported(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = Receiver(sock_dir)
    emitter = make_emitter(sock_dir, queue_size=1)
    real_start = emitter._start_thread
    monkeypatch.setattr(emitter, "_start_thread", lambda: None)  # hold the sender back
    assert emitter.submit(RUN, wire.KIND_PROVENANCE, 1, [prov(0, 0)]) is True
    assert emitter.submit(RUN, wire.KIND_PROVENANCE, 2, [prov(0, 1)]) is False
    assert emitter.submit(RUN, wire.KIND_PROVENANCE, 3, [prov(0, 2)]) is False
    real_start()
    frames = receiver.read(2)
    assert emitter.submit(RUN, wire.KIND_PROVENANCE, 4, [prov(0, 3)]) is True
    emitter.close(5.0)
    frames += receiver.read_all()
    assert [f.header.seq for f in frames] == [0, 1, 2]
    assert [f.header.step for f in frames[1:]] == [1, 4]
    # The two losses are reported by the next frame sent, then the counter resets.
    assert [f.header.dropped for f in frames[1:]] == [2, 0]
    assert emitter.stats()["dropped"] == 2
    assert emitter.stats()["submitted"] == 4
    receiver.close()


def test_full_receiver_is_waited_for_not_dropped(sock_dir: Path) -> None:
    receiver = Receiver(sock_dir)
    receiver.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    emitter = make_emitter(sock_dir, send_timeout=60.0)
    qlen = int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text())
    total = qlen + 40
    for step in range(total):
        emitter.submit(RUN, wire.KIND_PROVENANCE, step, [prov(0, step)])
    # Wait until the sender stalls on the full receiver queue.
    previous = -1
    while emitter.stats()["sent"] != previous:
        previous = emitter.stats()["sent"]
        time.sleep(0.3)
    assert previous < total + 1  # it is blocked, not finished
    frames: list[Frame] = []
    while len(frames) < total + 1:
        frames += receiver.read(1)
    emitter.close(5.0)
    assert [f.header.seq for f in frames] == list(range(total + 1))
    assert all(f.header.dropped == 0 for f in frames)
    assert emitter.stats()["dropped"] == 0
    receiver.close()


def test_send_timeouts_are_reported_and_leave_no_sequence_gap(sock_dir: Path) -> None:
    receiver = Receiver(sock_dir)
    emitter = make_emitter(sock_dir, send_timeout=0.001)
    qlen = int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text())
    total = qlen + 30
    for step in range(total):
        emitter.submit(RUN, wire.KIND_PROVENANCE, step, [prov(0, step)])
    # Wait until the sender has processed every item (each ends sent or dropped).
    while emitter.stats()["sent"] + emitter.stats()["dropped"] < total + 1:
        time.sleep(0.05)
    frames = receiver.read_all()
    # Free the receiver, then one more frame carries whatever was still unreported.
    emitter.submit(RUN, wire.KIND_PROVENANCE, total, [prov(0, total)])
    emitter.close(5.0)
    frames += receiver.read_all()
    stats = emitter.stats()
    assert stats["dropped"] > 0
    assert [f.header.seq for f in frames] == list(range(len(frames)))
    data_frames = [f for f in frames if f.kind == wire.KIND_PROVENANCE]
    assert len(data_frames) + sum(f.header.dropped for f in frames) == total + 1
    assert sum(f.header.dropped for f in frames) == stats["dropped"]
    receiver.close()


def test_missing_socket_counts_drops_until_it_appears(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(emitter_module, "RECHECK_SECONDS", 0.0)
    emitter = make_emitter(sock_dir)
    emitter.submit(RUN, wire.KIND_PROVENANCE, 1, [prov(0, 0)])
    emitter.submit(RUN, wire.KIND_PROVENANCE, 2, [prov(0, 1)])
    while emitter.stats()["dropped"] < 2:
        time.sleep(0.01)
    receiver = Receiver(sock_dir)
    emitter.submit(RUN, wire.KIND_PROVENANCE, 3, [prov(0, 2)])
    emitter.close(5.0)
    frames = receiver.read_all()
    assert [(f.kind, f.header.seq, f.header.dropped) for f in frames] == [
        (wire.KIND_HELLO, 0, 0),
        (wire.KIND_PROVENANCE, 1, 2),
    ]
    receiver.close()


def test_socket_with_wrong_mode_is_refused(
    sock_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    receiver = Receiver(sock_dir)
    os.chmod(receiver.path, 0o666)
    emitter = make_emitter(sock_dir)
    with caplog.at_level("WARNING", logger="parallelhue_vllm"):
        emitter.submit(RUN, wire.KIND_PROVENANCE, 1, [prov(0, 0)])
        emitter.submit(RUN, wire.KIND_PROVENANCE, 2, [prov(0, 1)])
        emitter.close(5.0)
    assert receiver.read_all() == []
    assert emitter.stats()["dropped"] == 2
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        f"parallelhue: telemetry for run {RUN} not sent: socket {receiver.path} has mode 0666, "
        "expected 0600: restart the client (it creates the socket 0600)"
    ]
    receiver.close()


def test_oversized_step_is_split_with_same_step(sock_dir: Path) -> None:
    receiver = Receiver(sock_dir)
    emitter = make_emitter(
        sock_dir,
        role=wire.SOURCE_FRONTEND,
        spec_method="",
        num_speculative_tokens=0,
        role_derivation=wire.DERIVATION_NONE,
    )
    records: list[wire.Record] = [
        wire.TextRecord(stream, 0, [wire.TextToken(5, b"x")], b"y" * 20000) for stream in range(7)
    ]
    emitter.submit(RUN, wire.KIND_TEXT, 9, records)
    emitter.close(5.0)
    frames = receiver.read_all()
    assert frames[0].kind == wire.KIND_HELLO
    text_frames = frames[1:]
    assert len(text_frames) == 3  # 20 kB records, 64 kB frames: 3 + 3 + 1
    assert [f.header.seq for f in text_frames] == [1, 2, 3]
    assert {f.header.step for f in text_frames} == {9}
    assert [r.stream for f in text_frames for r in f.records] == list(range(7))
    receiver.close()


def test_notice_carries_current_step(sock_dir: Path) -> None:
    receiver = Receiver(sock_dir)
    emitter = make_emitter(sock_dir)
    emitter.submit(RUN, wire.KIND_PROVENANCE, 41, [prov(3, 0)])
    emitter.notice(RUN, 3, wire.NOTICE_STREAM_INTERVAL, "not exact: stream_interval=4")
    emitter.close(5.0)
    frames = receiver.read_all()
    assert frames[-1].kind == wire.KIND_NOTICE
    assert frames[-1].header.step == 41
    assert frames[-1].records == [
        wire.NoticeRecord(3, wire.NOTICE_STREAM_INTERVAL, "not exact: stream_interval=4")
    ]
    receiver.close()


def test_end_run_clears_state_and_a_later_frame_starts_a_new_source(sock_dir: Path) -> None:
    receiver = Receiver(sock_dir)
    emitter = make_emitter(sock_dir)
    emitter.submit(RUN, wire.KIND_PROVENANCE, 1, [prov(0, 0)])
    emitter.end_run(RUN)
    first = receiver.read(2)
    while emitter.stats()["runs"] != 0:
        time.sleep(0.01)
    emitter.submit(RUN, wire.KIND_PROVENANCE, 2, [prov(1, 0)])
    emitter.close(5.0)
    second = receiver.read_all()
    assert [(f.kind, f.header.seq) for f in first + second] == [
        (wire.KIND_HELLO, 0),
        (wire.KIND_PROVENANCE, 1),
        (wire.KIND_HELLO, 0),
        (wire.KIND_PROVENANCE, 1),
    ]
    assert first[0].header.source_id != second[0].header.source_id
    receiver.close()


def test_run_state_is_bounded(sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emitter_module, "MAX_RUNS", 2)
    emitter = make_emitter(sock_dir)
    for index in range(5):
        emitter.submit(f"{index:032x}", wire.KIND_PROVENANCE, 1, [prov(0, 0)])
    emitter.close(5.0)
    assert emitter.stats()["runs"] == 0  # close forgets everything
    emitter = make_emitter(sock_dir)
    for index in range(5):
        emitter.submit(f"{index:032x}", wire.KIND_PROVENANCE, 1, [prov(0, 0)])
    while emitter.stats()["dropped"] < 5:
        time.sleep(0.01)
    assert emitter.stats()["runs"] == 2
    emitter.close()


def test_bad_input_never_raises_and_the_sender_survives(sock_dir: Path) -> None:
    receiver = Receiver(sock_dir)
    emitter = make_emitter(sock_dir)
    too_many = wire.ProvenanceRecord(0, 0, [1] * 300, [wire.ROLE_ACCEPTED] * 300, 300)
    assert emitter.submit("not-a-run-id", wire.KIND_PROVENANCE, 1, [prov(0, 0)]) is True
    assert emitter.submit(RUN, wire.KIND_PROVENANCE, 1, [too_many]) is True
    assert emitter.submit(RUN, 99, 1, [prov(0, 0)]) is True
    assert emitter.submit(RUN, wire.KIND_PROVENANCE, 2, [prov(0, 0)]) is True
    emitter.close(5.0)
    frames = receiver.read_all()
    # The two steps that could not be encoded are lost frames, reported by the next one.
    assert [(f.kind, f.header.seq, f.header.step, f.header.dropped) for f in frames] == [
        (wire.KIND_HELLO, 0, 2, 0),
        (wire.KIND_PROVENANCE, 1, 2, 2),
    ]
    assert emitter.stats()["send_errors"] == 2
    assert emitter.stats()["dropped"] == 2
    assert emitter.submit(RUN, wire.KIND_PROVENANCE, 3, [prov(0, 1)]) is False  # closed
    receiver.close()


def test_a_stalled_client_is_reported_once_and_does_not_hold_the_sender(
    sock_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stalled = Receiver(sock_dir)  # never reads
    other = Receiver(sock_dir, OTHER_RUN)
    emitter = make_emitter(sock_dir, send_timeout=0.2)
    qlen = int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text())
    total = qlen + 20
    with caplog.at_level("WARNING", logger="parallelhue_vllm"):
        for step in range(total):
            emitter.submit(RUN, wire.KIND_PROVENANCE, step, [prov(0, step)])
        emitter.submit(OTHER_RUN, wire.KIND_PROVENANCE, 1, [prov(0, 0)])
        frames = other.read(2)  # the other run's hello and frame get through
        emitter.close(5.0)
    assert [f.kind for f in frames] == [wire.KIND_HELLO, wire.KIND_PROVENANCE]
    # One timeout, then the stalled run's frames are dropped at once, not waited for.
    assert emitter.stats()["dropped"] == total + 1 - len(stalled.read_all())
    assert [r.getMessage() for r in caplog.records] == [
        f"parallelhue: telemetry frames for run {RUN} dropped (the client did not read for "
        "0.2 s); the client is told"
    ]
    stalled.close()
    other.close()


_PAUSED_SENDER = """
import json, sys
from parallelhue_vllm import wire
from parallelhue_vllm.emitter import Emitter
emitter = Emitter(
    role=wire.SOURCE_SCHEDULER, engine=wire.ENGINE_VLLM, engine_version="0.32.0+cpu",
    plugin_version="0.1.0", spec_method="ngram", num_speculative_tokens=3,
    role_derivation=wire.DERIVATION_DRAFT_IDS, async_scheduling=False,
    socket_dir=sys.argv[1], send_timeout=0.5,
)
for step in range(int(sys.argv[3])):
    record = wire.ProvenanceRecord(0, step, [7], [wire.ROLE_PLAIN], 0)
    emitter.submit(sys.argv[2], wire.KIND_PROVENANCE, step, [record])
emitter.close(30.0)
print(json.dumps(emitter.stats()))
"""


def test_a_sender_stopped_through_its_timeout_does_not_blame_a_client_that_reads(
    sock_dir: Path,
) -> None:
    """vLLM's process stopped (SIGSTOP, a long pause) while its sender waits on a full
    receiver, past the sender's timeout. The client reads all along, but another
    source's datagrams (the scheduler keeps stepping) fill its queue again just as the
    process runs on: its wait has expired by the wall clock and the queue is full for
    a moment. The client is not slow, so nothing may be dropped (before, such a pause
    lost frames and the run's EXACT with them)."""
    import json
    import signal

    receiver = Receiver(sock_dir)
    qlen = int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text())
    steps = qlen + 20
    child = subprocess.Popen(
        [sys.executable, "-c", _PAUSED_SENDER, str(sock_dir), RUN, str(steps)],
        stdout=subprocess.PIPE,
        text=True,
    )
    other = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    datagrams: list[bytes] = []
    try:
        receiver.sock.settimeout(10.0)
        datagrams.append(receiver.sock.recv(1 << 17))  # the hello: the sender runs
        time.sleep(0.3)  # it fills the queue at once and waits on the next frame
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        # SIGSTOP takes effect asynchronously: drain only once the sender is stopped.
        while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < deadline, "the sender never stopped"
            time.sleep(0.01)
        receiver.sock.setblocking(False)
        while True:  # the client reads all along
            try:
                datagrams.append(receiver.sock.recv(1 << 17))
            except BlockingIOError:
                break
        time.sleep(1.0)  # twice the sender's timeout
        other.setblocking(False)
        while True:  # the other source fills the queue again, to the brim
            try:
                other.sendto(b"other", str(receiver.path))
            except BlockingIOError:
                break
        os.kill(child.pid, signal.SIGCONT)
        time.sleep(0.02)  # the client reads on a moment later
        receiver.sock.settimeout(1.0)
        while True:  # until the sender has exited and nothing is left
            try:
                datagrams.append(receiver.sock.recv(1 << 17))
            except TimeoutError:
                if child.poll() is not None:
                    break
                assert time.monotonic() < deadline + 30, "the sender never finished"
        out, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        other.close()
        receiver.close()
    frames = [decode_frame(d) for d in datagrams if d != b"other"]
    stats = json.loads(out)
    assert (stats["dropped"], stats["sent"]) == (0, steps + 1)
    assert [f.header.dropped for f in frames] == [0] * (steps + 1)
    assert [f.header.seq for f in frames] == list(range(steps + 1))
