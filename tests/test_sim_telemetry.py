"""The simulated engine's telemetry: hello, one datagram per step per run, two sources."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from parallelhue.headless import run_headless as run_session
from parallelhue.reference import decode_frame
from parallelhue.sim import SimConfig, SimServer
from parallelhue_vllm import paths, wire


@pytest.fixture
def socket_dir() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="pht", dir="/tmp")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def session_against(config: SimConfig, **session: Any) -> Any:
    """The real client, headless, against a simulated engine started for it."""

    async def main() -> Any:
        server = SimServer(config)
        url = await server.start()
        try:
            return await run_session(url, **session)
        finally:
            await server.stop()

    return asyncio.run(main())


def test_sources_announce_a_simulated_engine_and_streams_are_exact(socket_dir: str) -> None:
    config = SimConfig(step_ms=1.0, socket_dir=socket_dir, draft_len=3)
    result = session_against(config, num_streams=3, socket_dir=socket_dir, max_tokens=30)
    assert [v for v, _ in result.verdicts] == ["exact"] * 3
    roles = sorted(source["role"] for source in result.sources)
    assert roles == ["frontend", "scheduler"]
    for source in result.sources:
        assert source["engine"] == "simulated"
        assert source["engine_version"] == "sim-1"
        assert source["async_scheduling"] is False
        # Only the scheduler announces speculative decoding; the frontend has no drafts.
        scheduler = source["role"] == "scheduler"
        assert source["spec_method"] == ("simulated" if scheduler else "")
        assert source["num_speculative_tokens"] == (3 if scheduler else 0)
        assert source["role_derivation"] == ("draft_ids" if scheduler else "none")
    assert len({source["source_id"] for source in result.sources}) == 2


def test_without_drafts_the_hello_says_no_speculative_decoding(socket_dir: str) -> None:
    config = SimConfig(step_ms=1.0, socket_dir=socket_dir, draft_len=0)
    result = session_against(config, num_streams=2, socket_dir=socket_dir, max_tokens=12)
    assert [v for v, _ in result.verdicts] == ["exact"] * 2
    for source in result.sources:
        assert (source["spec_method"], source["num_speculative_tokens"]) == ("", 0)
        assert source["role_derivation"] == "none"
    assert result.totals["plain"] == 24


class RawReceiver:
    """Binds a run's socket and keeps every datagram (no reconciliation)."""

    def __init__(self, socket_dir: str, run_id: str) -> None:
        directory = paths.ensure_socket_dir(socket_dir, create=True)
        self.path = paths.socket_path(directory, run_id)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        old = os.umask(0o177)
        try:
            self.sock.bind(self.path)
        finally:
            os.umask(old)
        self.sock.setblocking(False)
        self.frames: list[bytes] = []
        asyncio.get_running_loop().add_reader(self.sock.fileno(), self.drain)

    def drain(self) -> None:
        while True:
            try:
                self.frames.append(self.sock.recv(1 << 17))
            except BlockingIOError:
                return

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.sock.fileno())
        self.sock.close()
        os.unlink(self.path)


def test_one_datagram_per_step_per_run_holds_every_record_of_that_step(socket_dir: str) -> None:
    run_a, run_b = secrets.token_hex(16), secrets.token_hex(16)

    async def main() -> tuple[RawReceiver, RawReceiver, list[str]]:
        receivers = (RawReceiver(socket_dir, run_a), RawReceiver(socket_dir, run_b))
        server = SimServer(SimConfig(step_ms=1.0, socket_dir=socket_dir))
        url = await server.start()
        untagged: list[str] = []
        try:
            async with httpx.AsyncClient() as client:

                async def one(run_id: str | None, stream: int) -> None:
                    headers = {"X-Request-Id": wire.request_id(run_id, stream)} if run_id else {}
                    response = await client.post(
                        url + "/v1/completions",
                        json={"prompt": "x", "max_tokens": 25, "stream": True},
                        headers=headers,
                    )
                    if run_id is None:
                        untagged.append(response.text)

                await asyncio.gather(
                    *(one(run_a, s) for s in range(3)),
                    *(one(run_b, s) for s in range(2)),
                    one(None, 0),
                )
        finally:
            await server.stop()
        await asyncio.sleep(0.1)
        for receiver in receivers:
            receiver.drain()
            receiver.close()
        return receivers[0], receivers[1], untagged

    receiver_a, receiver_b, untagged = asyncio.run(main())
    assert untagged and "data: [DONE]" in untagged[0]
    for receiver, run_id, streams in ((receiver_a, run_a, 3), (receiver_b, run_b, 2)):
        frames = [decode_frame(data) for data in receiver.frames]
        assert {frame.header.run_id.hex() for frame in frames} == {run_id}
        by_source: dict[int, list[Any]] = {}
        for frame in frames:
            by_source.setdefault(frame.header.source_id, []).append(frame)
        assert len(by_source) == 2
        for source_frames in by_source.values():
            source_frames.sort(key=lambda frame: frame.header.seq)
            assert [f.header.seq for f in source_frames] == list(range(len(source_frames)))
            assert source_frames[0].kind == wire.KIND_HELLO
            data_frames = source_frames[1:]
            kinds = {frame.kind for frame in data_frames}
            assert len(kinds) == 1
            steps = [frame.header.step for frame in data_frames]
            assert steps == sorted(set(steps)), "one frame per step"
            tokens: dict[int, int] = {}
            for frame in data_frames:
                records = frame.records
                assert len({r.stream for r in records}) == len(records)
                for record in records:
                    count = (
                        len(record.token_ids)
                        if isinstance(record, wire.ProvenanceRecord)
                        else len(record.tokens)
                    )
                    tokens[record.stream] = tokens.get(record.stream, 0) + count
            assert tokens == dict.fromkeys(range(streams), 25)
            # Streams that run together share frames: fewer frames than records.
            assert len(data_frames) < sum(len(frame.records) for frame in data_frames)


def test_an_idle_run_is_ended_in_both_emitters(monkeypatch: Any, socket_dir: str) -> None:
    from parallelhue.sim import server as server_module

    monkeypatch.setattr(server_module, "RUN_IDLE_SECONDS", 0.0)

    async def main() -> tuple[dict[str, int], dict[str, int]]:
        server = SimServer(SimConfig(step_ms=1.0, socket_dir=socket_dir))
        url = await server.start()
        try:
            result = await run_session(url, num_streams=2, socket_dir=socket_dir, max_tokens=8)
            assert [v for v, _ in result.verdicts] == ["exact"] * 2
            assert server.scheduler_emitter is not None and server.frontend_emitter is not None
            for _ in range(200):  # bounded: the emitters' threads forget the run
                stats = (server.scheduler_emitter.stats(), server.frontend_emitter.stats())
                if stats[0]["runs"] == 0 and stats[1]["runs"] == 0:
                    break
                await asyncio.sleep(0.01)
            return stats
        finally:
            await server.stop()

    scheduler, frontend = asyncio.run(main())
    assert (scheduler["runs"], frontend["runs"]) == (0, 0)
    assert scheduler["sent"] > 1 and frontend["sent"] > 1


def test_merged_sse_chunks_still_reconcile_exactly(socket_dir: str) -> None:

    async def main() -> tuple[Any, int]:
        config = SimConfig(step_ms=1.0, socket_dir=socket_dir, sse_interval_ms=4.0)
        server = SimServer(config)
        url = await server.start()
        try:
            result = await run_session(url, num_streams=4, socket_dir=socket_dir, max_tokens=80)
        finally:
            await server.stop()
        return result, server.engine.step_records

    result, step_records = asyncio.run(main())
    assert [v for v, _ in result.verdicts] == ["exact"] * 4
    assert result.sse_tokens == 320
    assert result.sse_chunks <= step_records


def _kinds() -> list[str]:
    try:
        from parallelhue import _native
    except ImportError:
        return ["python"]
    return ["python", "rust"] if hasattr(_native, "HttpStreams") else ["python"]


def test_the_benchmarks_headless_client_reconciles_exactly(socket_dir: str) -> None:
    """The client of benches/bench_load.py (the real one, headless), on each path."""

    for kind in _kinds():
        result = session_against(
            SimConfig(step_ms=1.0, socket_dir=socket_dir),
            num_streams=4,
            socket_dir=socket_dir,
            max_tokens=50,
            reconciler_kind=kind,
            stop=["。"],
        )
        assert [v for v, _ in result.verdicts] == ["exact"] * 4, result.verdicts
        assert result.totals["tokens"] == result.sse_tokens
        assert all(reason in ("stop", "length") for reason in result.finish_reasons)
