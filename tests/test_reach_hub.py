"""The server-local telemetry hub (plugin/parallelhue_vllm/hub.py) and the emitters'
in-band envelopes to it (emitter.py, destination.py), with real AF_UNIX sockets: each
claim keeps only its own request's frames (its own sources), the uid check, bounded
claims, a closing hub, hubs that start late or exit, one path per run."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from parallelhue.reference import decode_frame
from parallelhue_vllm import destination as destination_module
from parallelhue_vllm import hub as hub_module
from parallelhue_vllm import inband, wire
from parallelhue_vllm.destination import Destination
from parallelhue_vllm.emitter import Emitter
from parallelhue_vllm.hub import Claim, Hub, HubError, HubFull, HubLimits

NOBODY = 65534
RUN = "ab" * 16


@pytest.fixture
def base() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="phhub", dir="/tmp") as name:
        os.chmod(name, 0o700)
        yield os.path.join(name, "hubs")


def make_hub(base: str, scope: str = "abc1", **limits: Any) -> Hub:
    hub = Hub(scope, base=base, limits=HubLimits(**limits))
    hub.start()
    return hub


def envelope(key: bytes, frame: bytes, role: int = wire.SOURCE_SCHEDULER, flags: int = 0) -> bytes:
    return inband.encode_envelopes([inband.Envelope(key, role, flags, 1, frame)])[0]


def sender(hub: Hub) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.connect(hub.path)
    return sock


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


def frames_of(events: bytes) -> list[bytes]:
    out: list[bytes] = []
    for event in events.split(b"\n\n"):
        if event:
            data = event.split(b"data: ", 1)[1].decode()
            out += [i for i in inband.decode_event(data) if isinstance(i, bytes)]
    return out


async def take_frames(claim: Claim, count: int) -> list[bytes]:
    frames: list[bytes] = []
    async with asyncio.timeout(10):
        while len(frames) < count:
            await claim.news(0.05)
            frames += frames_of(claim.take())
    return frames


def test_datagrams_that_are_not_envelopes_are_rejected(base: str) -> None:
    hub = make_hub(base)

    async def main() -> None:
        claim = hub.claim()
        claim.bind("req-1")
        sock = sender(hub)
        sock.send(b"PHUE" + bytes(60))  # a bare frame: not for a hub any more
        sock.send(b"PHIB\x00\x00\x05\x00")  # an envelope cut in its head
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 19)
        sock.send(b"PHIB" + bytes(inband.MAX_ENVELOPE_DATAGRAM))  # beyond the limit
        good = b"PHUE" + bytes(100)
        sock.send(envelope(b"req-1", good))
        assert await take_frames(claim, 1) == [good]
        assert hub.stats()["rejected"] == 3
        claim.close()
        sock.close()

    asyncio.run(main())
    hub.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="sending as another uid needs root")
def test_envelopes_from_another_uid_are_rejected(base: str) -> None:
    hub = make_hub(base)
    # Let the other user reach the socket at all: only the credentials check stands.
    for directory in (os.path.dirname(base), base, hub.dir):
        os.chmod(directory, 0o711)
    os.chmod(hub.path, 0o666)

    async def main() -> None:
        claim = hub.claim()
        claim.bind("req-1")
        forged = envelope(b"req-1", b"PHUE" + b"\xee" * 100)
        pid = os.fork()
        if pid == 0:  # child: become nobody, send one forged envelope
            code = 1
            try:
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                child = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                child.connect(hub.path)
                child.send(forged)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        wait_for(lambda: hub.stats()["rejected_uid"] == 1)
        genuine = b"PHUE" + b"\x11" * 100
        sock = sender(hub)
        sock.send(envelope(b"req-1", genuine))
        assert await take_frames(claim, 1) == [genuine]
        assert hub.stats()["accepted"] == 1
        claim.close()
        sock.close()

    asyncio.run(main())
    hub.close()


def test_claims_beyond_the_limit_are_refused(base: str) -> None:
    hub = make_hub(base, max_claims=2)

    async def main() -> None:
        claims = [hub.claim(), hub.claim()]
        with pytest.raises(HubFull) as error:
            hub.claim()
        assert str(error.value) == (
            "2 requests with in-band telemetry are open, the most this server allows"
        )
        claims[0].close()
        hub.claim().close()  # a slot is free again
        claims[1].close()

    asyncio.run(main())
    hub.close()


def test_closing_the_hub_ends_every_claim_and_removes_its_socket(base: str) -> None:
    hub = make_hub(base, wait_seconds=30)

    async def main() -> None:
        claim = hub.claim()
        claim.bind("req-1")
        waiting = asyncio.ensure_future(claim.finish())
        await asyncio.sleep(0.05)
        hub.close()
        async with asyncio.timeout(5):
            tail = await waiting
        end = inband.decode_event(tail.split(b"data: ", 1)[1].rstrip(b"\n").decode())[-1]
        assert isinstance(end, inband.End) and end.status == inband.STATUS_HUB_CLOSED

    asyncio.run(main())
    assert not os.path.exists(hub.path)


def test_an_unsafe_hub_directory_is_refused(base: str) -> None:
    os.makedirs(base, mode=0o755)
    os.chmod(base, 0o755)
    with pytest.raises(HubError) as error:
        make_hub(base)
    assert str(error.value) == (
        f"hub directory {base} has mode 0755, expected 0700: run chmod 700 {base}"
    )


def test_sockets_of_dead_hubs_are_removed_by_the_next_hub(base: str) -> None:
    hub = make_hub(base, scope="dead")
    dead_path = os.path.join(hub.dir, "hub-999999999.sock")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(dead_path)
    dead.close()  # the file stays, nobody listens: like a hub killed by SIGKILL
    old = time.time() - 3600
    os.utime(hub.dir, (old, old))
    other = make_hub(base, scope="a11e")
    assert not os.path.exists(dead_path)
    assert os.path.exists(hub.path)  # a live hub's socket is kept
    other.close()
    hub.close()


# ------------------------------------------------------------------ emitters -> hubs
def make_emitter(destination: Destination, role: int = wire.SOURCE_SCHEDULER) -> Emitter:
    return Emitter(
        role=role,
        engine=wire.ENGINE_SIMULATED,
        engine_version="sim-1",
        plugin_version="test",
        spec_method="",
        num_speculative_tokens=0,
        role_derivation=wire.DERIVATION_NONE,
        async_scheduling=False,
        destination=destination,
    )


def provenance(offset: int, stream: int = 0) -> wire.ProvenanceRecord:
    return wire.ProvenanceRecord(stream, offset, [10 + offset], [wire.ROLE_PLAIN], 0)


def test_each_claim_gets_only_its_own_requests_frames_from_its_own_source(base: str) -> None:
    # Two hubs in one scope, as two API-server processes run them.
    first = make_hub(base, scope="fa0")
    second = Hub("fa0", base=base, name="2")
    second.start()
    emitter = make_emitter(
        Destination(None, 2.0, client_sockets=False, hub_dir=first.dir, use_env_scope=False)
    )

    async def main() -> None:
        mine, theirs = first.claim(), first.claim()
        mine.bind("req-0")
        theirs.bind("req-1")
        emitter.begin_request(RUN, 0, "req-0")
        emitter.begin_request(RUN, 1, "req-1")
        for offset in range(3):
            # One step, both requests of the run: split into each request's own frames.
            emitter.submit(
                RUN,
                wire.KIND_PROVENANCE,
                offset + 1,
                [provenance(offset, 0), provenance(offset, 1)],
            )
        emitter.close(5.0)
        for claim, stream in ((mine, 0), (theirs, 1)):
            decoded = [decode_frame(f) for f in await take_frames(claim, 4)]
            assert [(f.kind, f.header.seq) for f in decoded] == [
                (wire.KIND_HELLO, 0),
                (wire.KIND_PROVENANCE, 1),
                (wire.KIND_PROVENANCE, 2),
                (wire.KIND_PROVENANCE, 3),
            ]
            assert {r.stream for f in decoded[1:] for r in f.records} == {stream}
            assert len({f.header.source_id for f in decoded}) == 1
        # The other hub got every envelope too; nobody claimed them there.
        wait_for(lambda: second.stats()["unclaimed"] == 8)
        mine.close()
        theirs.close()

    try:
        asyncio.run(main())
    finally:
        first.close()
        second.close()


def test_a_run_with_a_client_socket_goes_there_only(base: str) -> None:
    hub = make_hub(base, scope="50c0")
    sock_dir = tempfile.mkdtemp(prefix="phs", dir="/tmp")
    os.chmod(sock_dir, 0o700)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    client_path = os.path.join(sock_dir, f"{RUN}.sock")
    client.bind(client_path)
    os.chmod(client_path, 0o600)
    emitter = make_emitter(Destination(sock_dir, 2.0, hub_dir=hub.dir, use_env_scope=False))
    try:
        emitter.begin_request(RUN, 0, "req-0")
        emitter.submit(RUN, wire.KIND_PROVENANCE, 1, [provenance(0)])
        emitter.close(5.0)
        client.settimeout(5)
        decoded = [decode_frame(client.recv(1 << 17)) for _ in range(2)]
        assert [f.kind for f in decoded] == [wire.KIND_HELLO, wire.KIND_PROVENANCE]
        assert hub.stats()["frames"] == 0 and hub.stats()["rejected"] == 0
    finally:
        client.close()
        hub.close()
        shutil.rmtree(sock_dir)


def test_a_hub_that_starts_after_the_emitter_gets_the_next_runs_frames(
    base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(destination_module, "RESCAN_SECONDS", 0.0)
    scope_dir = hub_module.scope_dir("1a7e", base)
    emitter = make_emitter(
        Destination(None, 2.0, client_sockets=False, hub_dir=scope_dir, use_env_scope=False)
    )
    early_run = "11" * 16
    emitter.submit(early_run, wire.KIND_PROVENANCE, 1, [provenance(0)])  # nowhere to go: counted
    wait_for(lambda: emitter.stats()["dropped"] == 1)
    hub = make_hub(base, scope="1a7e")

    async def main() -> None:
        claim = hub.claim()
        claim.bind("late-0")
        emitter.begin_request(RUN, 0, "late-0")
        emitter.submit(RUN, wire.KIND_PROVENANCE, 2, [provenance(0)])
        decoded = [decode_frame(f) for f in await take_frames(claim, 2)]
        assert [(f.kind, f.header.seq, f.header.dropped) for f in decoded] == [
            (wire.KIND_HELLO, 0, 0),
            (wire.KIND_PROVENANCE, 1, 0),
        ]
        claim.close()

    asyncio.run(main())
    emitter.close(2.0)
    hub.close()


def test_a_hub_that_exits_does_not_stop_the_others(
    base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(destination_module, "RESCAN_SECONDS", 0.0)
    survivor = make_hub(base, scope="e0e0")
    leaving = Hub("e0e0", base=base, name="3")
    leaving.start()
    emitter = make_emitter(
        Destination(None, 2.0, client_sockets=False, hub_dir=survivor.dir, use_env_scope=False)
    )

    async def main() -> None:
        claim = survivor.claim()
        claim.bind("req-0")
        emitter.begin_request(RUN, 0, "req-0")
        emitter.submit(RUN, wire.KIND_PROVENANCE, 1, [provenance(0)])
        await take_frames(claim, 2)
        # The other hub's process dies without cleaning up: its socket file stays.
        assert leaving._sock is not None
        leaving._closing = True
        leaving._sock.close()
        emitter.submit(RUN, wire.KIND_PROVENANCE, 2, [provenance(1)])
        assert [decode_frame(f).header.seq for f in await take_frames(claim, 1)] == [2]
        claim.close()

    asyncio.run(main())
    emitter.close(2.0)
    assert emitter.stats()["dropped"] == 0
    survivor.close()


def test_hubs_in_a_directory_of_another_mode_are_not_used(
    base: str, caplog: pytest.LogCaptureFixture
) -> None:
    hub = make_hub(base, scope="0be0")
    os.chmod(hub.dir, 0o755)
    emitter = make_emitter(
        Destination(None, 2.0, client_sockets=False, hub_dir=hub.dir, use_env_scope=False)
    )

    with caplog.at_level("WARNING", logger="parallelhue_vllm"):
        emitter.begin_request(RUN, 0, "req-0")
        emitter.submit(RUN, wire.KIND_PROVENANCE, 1, [provenance(0)])
        wait_for(lambda: emitter.stats()["dropped"] == 1)
    emitter.close(2.0)
    assert hub.stats()["frames"] == 0
    assert (
        f"parallelhue: telemetry hubs not used: hub directory {hub.dir} has mode 0755, "
        f"expected 0700: run chmod 700 {hub.dir}"
    ) in caplog.messages
    os.chmod(hub.dir, 0o700)
    hub.close()


def test_without_hubs_a_missing_client_socket_is_reported_as_before(
    base: str, caplog: pytest.LogCaptureFixture
) -> None:
    sock_dir = Path(tempfile.mkdtemp(prefix="phs", dir="/tmp"))
    os.chmod(sock_dir, 0o700)
    emitter = make_emitter(
        Destination(
            str(sock_dir), 2.0, hub_dir=hub_module.scope_dir("0", base), use_env_scope=False
        )
    )
    with caplog.at_level("WARNING", logger="parallelhue_vllm"):
        emitter.submit("22" * 16, wire.KIND_PROVENANCE, 1, [provenance(0)])
        wait_for(lambda: emitter.stats()["dropped"] == 1)
    emitter.close(2.0)
    path = sock_dir / f"{'22' * 16}.sock"
    assert caplog.messages == [
        f"parallelhue: telemetry for run {'22' * 16} not sent: no socket at {path}: the client is "
        "not listening there; give the server the client's PARALLELHUE_SOCKET_DIR"
    ]
    sock_dir.rmdir()


def test_the_scope_is_chosen_once_and_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(hub_module.ENV_SCOPE, raising=False)
    chosen = hub_module.ensure_scope()
    assert len(chosen) == 16 and int(chosen, 16) >= 0
    assert os.environ[hub_module.ENV_SCOPE] == chosen  # what vLLM's child processes inherit
    assert hub_module.ensure_scope() == chosen
    monkeypatch.setenv(hub_module.ENV_SCOPE, "../etc")
    replaced = hub_module.ensure_scope()
    assert replaced != "../etc" and len(replaced) == 16
    with pytest.raises(HubError, match=r"^invalid hub scope '\.\./etc': expected 1-32 lowercase"):
        hub_module.scope_dir("../etc")
