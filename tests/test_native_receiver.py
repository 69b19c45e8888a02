"""The Rust telemetry receiver (`parallelhue._native.Receiver`).

Frames sent over the AF_UNIX socket from Python reach the shared Rust
reconciler; datagrams from another uid are dropped and counted; close() stops
the thread and unlinks the socket.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

native: Any = pytest.importorskip(
    "parallelhue._native", reason="the Rust extension is not built (run `make native`)"
)
from parallelhue_vllm.wire import (  # noqa: E402
    DERIVATION_DRAFT_IDS,
    ENGINE_SIMULATED,
    KIND_PROVENANCE,
    KIND_TEXT,
    ROLE_ACCEPTED,
    ROLE_TARGET,
    SOURCE_FRONTEND,
    SOURCE_SCHEDULER,
    Header,
    Hello,
    ProvenanceRecord,
    TextRecord,
    TextToken,
    encode_hello,
    encode_records,
)

RUN_ID = "0123456789abcdef0123456789abcdef"
RUN = bytes.fromhex(RUN_ID)
NOBODY = 65534


def hello(source_id: int, role: int) -> bytes:
    if role == 2:  # a frontend announces no speculative fields
        return encode_hello(
            Header(RUN, source_id, 0, 0, 1),
            Hello(role, ENGINE_SIMULATED, 0, False, 0, "0.2.0", "sim-1", "", 0),
        )
    return encode_hello(
        Header(RUN, source_id, 0, 0, 1),
        Hello(role, ENGINE_SIMULATED, DERIVATION_DRAFT_IDS, False, 3, "0.2.0", "sim-1", "ngram", 1),
    )


def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # Short and world-searchable (the other-uid test sends from uid 65534).
    d = Path(tempfile.mkdtemp(prefix="phr-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def send(path: Path, *frames: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        for f in frames:
            s.sendto(f, str(path))


def test_frames_reach_the_reconciler(sock_dir: Path) -> None:
    path = sock_dir / f"{RUN_ID}.sock"
    rec = native.Reconciler(RUN_ID, 1)
    rx = native.Receiver(str(path), rec)
    assert rx.path == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_ISSOCK(path.stat().st_mode)
    prov = encode_records(
        KIND_PROVENANCE,
        Header(RUN, 11, 1, 1, 2),
        [
            ProvenanceRecord(
                0, 0, [7, 8], [ROLE_ACCEPTED, ROLE_TARGET], 3, finished=True, finish_reason=1
            )
        ],
    )
    text = encode_records(
        KIND_TEXT,
        Header(RUN, 22, 1, 1, 2),
        [
            TextRecord(
                0,
                0,
                [TextToken(7, b"h"), TextToken(8, "é".encode())],
                "hé".encode(),
                finished=True,
                finish_reason=1,
            )
        ],
    )
    send(path, hello(11, SOURCE_SCHEDULER), hello(22, SOURCE_FRONTEND), prov, text, b"junk")
    wait_for(lambda: rec.counters()["frames"] == 5)
    rec.push_sse_id(0, f"chatcmpl-ph1_{RUN_ID}_0")
    rec.push_sse(0, "hé", [7, 8])
    rec.finish_sse(0, "stop")
    events = rec.drain()
    assert events[0] == ("run", "rejected frame: truncated frame: 4 bytes, header needs 64")
    # One step, one push_sse; an accepted draft then the target's correction: two spans.
    assert events[1:] == [
        ("span", 0, 0, "h", 0, 0, 1, ROLE_ACCEPTED),
        ("span", 0, 1, "é", 0, 1, 1, ROLE_TARGET),
        ("exact", 0),
    ]
    assert [s["role"] for s in rec.sources()] == ["scheduler", "frontend"]
    st = rx.stats()
    assert st["datagrams"] == 5 and st["rejected_uid"] == 0
    assert st["rcvbuf"] > 0
    rx.close()


def test_many_frames_and_close_flushes(sock_dir: Path) -> None:
    path = sock_dir / "many.sock"
    rec = native.Reconciler(RUN_ID, 4)
    with native.Receiver(path, rec, rcvbuf=4 << 20) as rx:
        frames = [hello(5, SOURCE_SCHEDULER)] + [
            encode_records(
                KIND_PROVENANCE,
                Header(RUN, 5, seq, seq, 2),
                [ProvenanceRecord(9, seq - 1, [1], [0], 0)],  # stream 9: foreign
            )
            for seq in range(1, 500)
        ]
        send(path, *frames)
    assert rx.closed
    assert not path.exists()
    assert rec.counters()["frames"] == 500
    assert rec.counters()["foreign_records"] == 499
    assert rx.stats()["datagrams"] == 500


def test_close_unlinks_and_is_idempotent(sock_dir: Path) -> None:
    path = sock_dir / "c.sock"
    rx = native.Receiver(str(path), native.Reconciler(RUN_ID, 1))
    assert path.exists() and not rx.closed
    rx.close()
    assert not path.exists() and rx.closed
    rx.close()
    # The path is free again.
    native.Receiver(str(path), native.Reconciler(RUN_ID, 1)).close()


def test_bind_errors(sock_dir: Path) -> None:
    rec = native.Reconciler(RUN_ID, 1)
    existing = sock_dir / "exists"
    existing.write_bytes(b"")
    with pytest.raises(OSError):
        native.Receiver(str(existing), rec)
    with pytest.raises(OSError, match="sun_path"):
        native.Receiver("/tmp/" + "x" * 120, rec)
    with pytest.raises(OSError):
        native.Receiver(str(sock_dir / "missing" / "r.sock"), rec)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to send as another uid")
def test_datagram_from_another_uid_is_rejected(sock_dir: Path) -> None:
    path = sock_dir / "uid.sock"
    rec = native.Reconciler(RUN_ID, 1)
    rx = native.Receiver(str(path), rec)
    # Let the other user reach the socket at all: only the uid check stands.
    path.chmod(0o666)
    frame = hello(77, SOURCE_SCHEDULER)
    pid = os.fork()
    if pid == 0:  # child: become nobody and send one datagram
        code = 1
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            send(path, frame)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    wait_for(lambda: rx.stats()["rejected_uid"] == 1)
    send(path, frame)  # the same datagram from our own uid is accepted
    wait_for(lambda: rec.counters()["frames"] == 1)
    assert rx.stats()["datagrams"] == 1
    assert [s["source_id"] for s in rec.sources()] == [77]
    rx.close()
