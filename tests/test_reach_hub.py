"""The server-local telemetry hub (plugin/parallelhue_vllm/hub.py) and the emitters' fan-out to it
(destination.py), with real AF_UNIX sockets: run isolation, the uid check, bounded memory,
counted drops, stalled and vanished subscribers, hubs that start late or exit."""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import socket
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from parallelhue.reference import decode_frame
from parallelhue_vllm import destination as destination_module
from parallelhue_vllm import hub as hub_module
from parallelhue_vllm import telemetry_stream as ts
from parallelhue_vllm import wire
from parallelhue_vllm.destination import Destination
from parallelhue_vllm.emitter import Emitter
from parallelhue_vllm.hub import Hub, HubError, HubFull, HubLimits, Subscription

NOBODY = 65534


@pytest.fixture
def base() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="phhub", dir="/tmp") as name:
        os.chmod(name, 0o700)
        yield os.path.join(name, "hubs")


def make_hub(base: str, scope: str = "abc1", **limits: Any) -> Hub:
    hub = Hub(scope, base=base, limits=HubLimits(**limits))
    hub.start()
    return hub


def frame(run: bytes, size: int = 200, fill: int = 0) -> bytes:
    """Just enough of a frame for the hub: magic, a version byte, the run id at 8..24."""
    head = b"PHUE\x01\x02\x00\x00" + run
    return head + bytes([fill]) * (size - len(head))


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


async def drain(
    sub: Subscription, decoder: ts.StreamDecoder, until: Callable[[list[ts.Item]], bool]
) -> list[ts.Item]:
    """Read chunks into items until `until(items)` holds (10 s at most)."""
    items: list[ts.Item] = []
    async with asyncio.timeout(10):
        while not until(items):
            chunk = await sub.next_chunk()
            if chunk is None:
                break
            items += decoder.push(chunk)
    return items


def frames_of(items: list[ts.Item]) -> list[bytes]:
    return [i.frame for i in items if i.kind == "frame"]


def test_each_subscriber_gets_only_its_own_runs_frames(base: str) -> None:
    hub = make_hub(base)

    async def main() -> None:
        a, b = hub.subscribe(), hub.subscribe()
        assert a.run_id != b.run_id and len(a.run_id) == 16
        sock = sender(hub)
        sent_a = [frame(a.run_id, 100 + i, i) for i in range(5)]
        sent_b = [frame(b.run_id, 300 + i, 0x80 + i) for i in range(3)]
        stranger = bytes(range(16))
        # Each stranger's frame goes before a's: once a has its fifth frame, the hub's
        # one reader has counted all five strangers (it reads one socket in order).
        for i in range(5):
            sock.send(frame(stranger, 120))
            sock.send(sent_a[i])
            if i < 3:
                sock.send(sent_b[i])
        da, db = ts.StreamDecoder(), ts.StreamDecoder()
        items_a = await drain(a, da, lambda items: len(frames_of(items)) >= 5)
        items_b = await drain(b, db, lambda items: len(frames_of(items)) >= 3)
        assert items_a[0].kind == "preamble" and items_a[0].run_id == a.run_id
        assert items_b[0].run_id == b.run_id
        assert frames_of(items_a) == sent_a
        assert frames_of(items_b) == sent_b
        stats = hub.stats()
        assert (stats["accepted"], stats["unclaimed"], stats["subscribers"]) == (8, 5, 2)
        a.close()
        b.close()
        sock.close()

    asyncio.run(main())
    hub.close()


def test_datagrams_that_are_not_frames_are_rejected(base: str) -> None:
    hub = make_hub(base)

    async def main() -> None:
        sub = hub.subscribe()
        sock = sender(hub)
        sock.send(b"PHUE" + sub.run_id)  # too short to carry a run id at 8..24
        sock.send(b"XXXX\x01\x02\x00\x00" + sub.run_id + bytes(40))  # wrong magic
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 18)
        sock.send(frame(sub.run_id, ts.MAX_FRAME_ITEM + 1))  # beyond a datagram's limit
        good = frame(sub.run_id, ts.MAX_FRAME_ITEM)  # the largest frame passes
        sock.send(good)
        items = await drain(sub, ts.StreamDecoder(), lambda items: bool(frames_of(items)))
        assert frames_of(items) == [good]
        assert hub.stats()["rejected"] == 3
        sub.close()
        sock.close()

    asyncio.run(main())
    hub.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="sending as another uid needs root")
def test_frames_from_another_uid_are_rejected(base: str) -> None:
    hub = make_hub(base)
    # Let the other user reach the socket at all: only the credentials check stands.
    for directory in (os.path.dirname(base), base, hub.dir):
        os.chmod(directory, 0o711)
    os.chmod(hub.path, 0o666)

    async def main() -> None:
        sub = hub.subscribe()
        forged = frame(sub.run_id, 150, 0xEE)
        pid = os.fork()
        if pid == 0:  # child: become nobody, send one forged frame
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
        genuine = frame(sub.run_id, 150, 0x11)
        sock = sender(hub)
        sock.send(genuine)
        items = await drain(sub, ts.StreamDecoder(), lambda items: bool(frames_of(items)))
        assert frames_of(items) == [genuine]
        assert hub.stats()["accepted"] == 1
        sub.close()
        sock.close()

    asyncio.run(main())
    hub.close()


def test_a_subscriber_that_stops_reading_costs_its_cap_and_learns_the_exact_loss(base: str) -> None:
    cap = 64 << 10
    hub = make_hub(base, buffer_bytes=cap)

    async def main() -> None:
        sub = hub.subscribe()
        decoder = ts.StreamDecoder()
        decoder.push(await sub.next_chunk() or b"")  # the preamble
        sock = sender(hub)
        sent = [frame(sub.run_id, 1000, i % 256) for i in range(400)]  # ~400 KB, 6x the cap
        for data in sent:
            sock.send(data)
        wait_for(lambda: hub.stats()["frames"] == 400)
        stats = hub.stats()
        assert stats["buffered_bytes"] <= cap
        kept = stats["accepted"]
        assert stats["dropped"] == 400 - kept > 0
        assert sub.buffered == stats["buffered_bytes"]
        # Now it reads: the drop notice first, then the frames that fit, in order.
        items = await drain(sub, decoder, lambda items: len(frames_of(items)) >= kept)
        assert items[0] == ts.Item("dropped", frames=400 - kept)
        assert frames_of(items) == sent[:kept]
        assert hub.stats()["buffered_bytes"] == 0
        # Reading again makes room: later frames flow, with no new drop notice.
        sock.send(sent[0])
        more = await drain(sub, decoder, lambda items: bool(frames_of(items)))
        assert [i.kind for i in more] == ["frame"]
        sub.close()
        sock.close()

    asyncio.run(main())
    hub.close()


def test_the_total_cap_bounds_all_subscribers_together(base: str) -> None:
    hub = make_hub(base, buffer_bytes=64 << 10, total_bytes=80 << 10)

    async def main() -> None:
        subs = [hub.subscribe() for _ in range(3)]
        sock = sender(hub)
        for i in range(120):
            sock.send(frame(subs[i % 3].run_id, 1000))
        wait_for(lambda: hub.stats()["frames"] == 120)
        stats = hub.stats()
        assert stats["buffered_bytes"] <= 80 << 10
        assert stats["accepted"] + stats["dropped"] == 120 and stats["dropped"] > 0
        assert sum(s.buffered for s in subs) == stats["buffered_bytes"]
        for sub in subs:
            sub.close()
        assert hub.stats()["buffered_bytes"] == 0
        sock.close()

    asyncio.run(main())
    hub.close()


def test_a_vanished_subscriber_frees_its_memory_at_once(base: str) -> None:
    hub = make_hub(base, buffer_bytes=8 << 20)
    tracemalloc.start()
    try:

        async def main() -> tuple[int, int, int]:
            sock = sender(hub)
            warm = hub.subscribe()  # warm up the code paths before the baseline
            sock.send(frame(warm.run_id))
            await drain(warm, ts.StreamDecoder(), lambda items: bool(frames_of(items)))
            warm.close()
            gc.collect()
            baseline = tracemalloc.get_traced_memory()[0]
            sub = hub.subscribe()
            for i in range(1000):
                sock.send(frame(sub.run_id, 4000, i % 256))
            wait_for(lambda: hub.stats()["accepted"] == 1001)
            gc.collect()
            loaded = tracemalloc.get_traced_memory()[0]
            sub.close()  # what the HTTP layer does when the client disconnects
            later = frame(sub.run_id, 4000)
            for _ in range(50):
                sock.send(later)  # a run nobody reads any more: not kept
            wait_for(lambda: hub.stats()["unclaimed"] == 50)
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
            sock.close()
            return baseline, loaded, after

        baseline, loaded, after = asyncio.run(main())
    finally:
        tracemalloc.stop()
    assert loaded - baseline > 3_900_000  # the 4 MB were really held
    assert after - baseline < 64 << 10
    stats = hub.stats()
    assert (stats["subscribers"], stats["buffered_bytes"]) == (0, 0)
    hub.close()


def test_a_stalled_subscriber_is_cut_and_its_run_released(base: str) -> None:
    hub = make_hub(base, stall_seconds=0.3)

    async def main() -> None:
        sub = hub.subscribe()
        decoder = ts.StreamDecoder()
        decoder.push(await sub.next_chunk() or b"")
        sock = sender(hub)
        sock.send(frame(sub.run_id, 500))
        wait_for(lambda: hub.stats()["cut_stalled"] == 1)
        assert hub.stats()["subscribers"] == 0
        assert hub.stats()["buffered_bytes"] == 0
        sock.send(frame(sub.run_id, 500))
        wait_for(lambda: hub.stats()["unclaimed"] == 1)
        items = await drain(sub, decoder, lambda items: decoder.ended)
        assert items == [
            ts.Item(
                "end",
                code=ts.END_TOO_SLOW,
                message="the subscriber read nothing for 0.3 s; its telemetry was discarded",
            )
        ]
        assert await sub.next_chunk() is None
        sock.close()

    asyncio.run(main())
    hub.close()


def test_an_idle_stream_carries_heartbeats(base: str) -> None:
    hub = make_hub(base, heartbeat_seconds=0.05, stall_seconds=5)

    async def main() -> None:
        sub = hub.subscribe()
        decoder = ts.StreamDecoder()
        items = await drain(sub, decoder, lambda items: len(items) >= 3)
        assert [i.kind for i in items] == ["preamble", "heartbeat", "heartbeat"]
        assert items[0].heartbeat_ms == 50
        sub.close()

    asyncio.run(main())
    assert hub.stats()["cut_stalled"] == 0
    hub.close()


def test_subscribers_beyond_the_limit_are_refused(base: str) -> None:
    hub = make_hub(base, max_subscribers=2)

    async def main() -> None:
        first = [hub.subscribe(), hub.subscribe()]
        with pytest.raises(HubFull, match=r"^2 telemetry subscribers are connected, the most"):
            hub.subscribe()
        first[0].close()
        hub.subscribe().close()
        first[1].close()

    asyncio.run(main())
    hub.close()


def test_closing_the_hub_ends_every_stream_and_removes_its_socket(base: str) -> None:
    hub = make_hub(base)

    async def main() -> None:
        sub = hub.subscribe()
        decoder = ts.StreamDecoder()
        decoder.push(await sub.next_chunk() or b"")
        waiting = asyncio.ensure_future(drain(sub, decoder, lambda items: decoder.ended))
        await asyncio.sleep(0.05)
        await asyncio.get_running_loop().run_in_executor(None, hub.close)
        items = await waiting
        assert items == [
            ts.Item(
                "end", code=ts.END_HUB_CLOSED, message="the server's telemetry hub is shutting down"
            )
        ]
        with pytest.raises(HubFull, match="shutting down"):
            hub.subscribe()

    asyncio.run(main())
    assert not os.path.exists(hub.path) and not os.path.exists(hub.dir)


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


def provenance(offset: int) -> wire.ProvenanceRecord:
    return wire.ProvenanceRecord(0, offset, [10 + offset], [wire.ROLE_PLAIN], 0)


def test_an_emitter_fans_every_frame_out_to_every_hub_and_the_client_socket(base: str) -> None:
    # Two hubs in one scope, as two API-server processes run them.
    first = make_hub(base, scope="fa0")
    second = Hub("fa0", base=base, name="2")
    second.start()
    sock_dir = tempfile.mkdtemp(prefix="phs", dir="/tmp")
    os.chmod(sock_dir, 0o700)

    async def main() -> None:
        sub = first.subscribe()
        run = sub.run_id.hex()
        client = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        client_path = os.path.join(sock_dir, f"{run}.sock")
        client.bind(client_path)
        os.chmod(client_path, 0o600)
        emitter = make_emitter(Destination(sock_dir, 2.0, hub_dir=first.dir, use_env_scope=False))
        for offset in range(3):
            emitter.submit(run, wire.KIND_PROVENANCE, offset + 1, [provenance(offset)])
        emitter.close(5.0)
        items = await drain(sub, ts.StreamDecoder(), lambda items: len(frames_of(items)) >= 4)
        client.settimeout(5)
        over_socket = [client.recv(1 << 17) for _ in range(4)]
        assert frames_of(items) == over_socket
        decoded = [decode_frame(f) for f in over_socket]
        assert [(f.kind, f.header.seq) for f in decoded] == [
            (wire.KIND_HELLO, 0),
            (wire.KIND_PROVENANCE, 1),
            (wire.KIND_PROVENANCE, 2),
            (wire.KIND_PROVENANCE, 3),
        ]
        # The other hub got every frame too; nobody subscribed the run there.
        wait_for(lambda: second.stats()["unclaimed"] == 4)
        sub.close()
        client.close()

    try:
        asyncio.run(main())
    finally:
        first.close()
        second.close()
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
        sub = hub.subscribe()
        emitter.submit(sub.run_id.hex(), wire.KIND_PROVENANCE, 2, [provenance(0)])
        items = await drain(sub, ts.StreamDecoder(), lambda items: len(frames_of(items)) >= 2)
        decoded = [decode_frame(f) for f in frames_of(items)]
        assert [(f.kind, f.header.seq, f.header.dropped) for f in decoded] == [
            (wire.KIND_HELLO, 0, 0),
            (wire.KIND_PROVENANCE, 1, 0),
        ]
        sub.close()

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
        sub = survivor.subscribe()
        run = sub.run_id.hex()
        emitter.submit(run, wire.KIND_PROVENANCE, 1, [provenance(0)])
        decoder = ts.StreamDecoder()
        await drain(sub, decoder, lambda items: len(frames_of(items)) >= 2)
        # The other hub's process dies without cleaning up: its socket file stays.
        assert leaving._sock is not None
        leaving._closing = True
        leaving._sock.close()
        emitter.submit(run, wire.KIND_PROVENANCE, 2, [provenance(1)])
        items = await drain(sub, decoder, lambda items: bool(frames_of(items)))
        assert [decode_frame(f).header.seq for f in frames_of(items)] == [2]
        sub.close()

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

    async def main() -> None:
        sub = hub.subscribe()
        with caplog.at_level("WARNING", logger="parallelhue_vllm"):
            emitter.submit(sub.run_id.hex(), wire.KIND_PROVENANCE, 1, [provenance(0)])
            wait_for(lambda: emitter.stats()["dropped"] == 1)
        sub.close()

    asyncio.run(main())
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
