"""Replicas behind a load balancer (docs/REACH.md, "Fleets"): one run's requests
spread over two nodes, each with its own API server and hub, behind one
balancer (vLLM's hybrid or external data-parallel load balancing, or any
router in front of replicas).

Two SIMULATED engines stand for the nodes (each its own hub scope, as two
hosts would have) and a small HTTP load balancer in front sends the even
streams to node A, the odd streams to node B. Each request's telemetry rides
inside its own response (in-band), so every stream is EXACT whichever node
served it, and each node's hub keeps only the frames of the requests it
served. (With the old side route, a subscription to one node, the streams of
the other node ended `missing telemetry`.)
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any

import pytest

from parallelhue.cli.config import parse_run
from parallelhue.screen.views import make_console, make_view
from parallelhue.session import Session, SessionResult
from parallelhue.sim import SimServer
from test_reach_client import RECONCILERS, clean_env, sim_config

__all__ = ["clean_env"]  # the autouse fixture of test_reach_client applies here too

STREAMS = 6
_REQUEST_ID = re.compile(rb"(?im)^x-request-id:\s*ph1_[0-9a-f]{32}_(\d+)\s*$")


class Balancer:
    """A TCP front that picks the node per connection from its first request:
    even streams to `a`, odd streams to `b` (anything else to `a`)."""

    def __init__(self, a: str, b: str) -> None:
        self.nodes = {"a": _host_port(a), "b": _host_port(b)}
        self.served: dict[int, str] = {}
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        match = _REQUEST_ID.search(head)
        node = "a"
        if match is not None:
            stream = int(match.group(1))
            node = "a" if stream % 2 == 0 else "b"
            self.served[stream] = node
        up_reader, up_writer = await asyncio.open_connection(*self.nodes[node])
        up_writer.write(head)
        pumps = [
            asyncio.create_task(_pump(reader, up_writer)),
            asyncio.create_task(_pump(up_reader, writer)),
        ]
        self._tasks.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
                self._tasks.discard(pump)
            for w in (writer, up_writer):
                w.close()


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()


def run_behind_balancer(reconciler: str) -> tuple[SessionResult, Balancer, list[dict[str, Any]]]:
    console = make_console(False, plain=True)

    async def go() -> tuple[SessionResult, Balancer, list[dict[str, Any]]]:
        nodes = [SimServer(sim_config(telemetry_mode="http")) for _ in range(2)]
        urls = [await node.start() for node in nodes]
        balancer = Balancer(*urls)
        try:
            url = await balancer.start()
            argv = [
                "hi",
                "--endpoint",
                url + "/v1/chat/completions",
                "--concurrency",
                str(STREAMS),
                "--max-tokens",
                "30",
                "--mode",
                "exact",
                "--telemetry",
                "http",
                "--model",
                "parallelhue-sim",
                "--timeout",
                "20",
                "--reconciler",
                reconciler,
                "--view",
                "plain",
            ]
            session = Session(
                parse_run(argv, stdout_tty=False),
                lambda m: make_view("plain", m, console),
                simulated=True,
            )
            result = await session.run()
            hubs = [node.telemetry_stats()["hub"] for node in nodes]
            return result, balancer, hubs
        finally:
            await balancer.stop()
            for node in nodes:
                await node.stop()

    return asyncio.run(go())


@pytest.mark.parametrize("reconciler", RECONCILERS)
def test_every_stream_is_exact_whichever_node_served_it(reconciler: str) -> None:
    result, balancer, (hub_a, hub_b) = run_behind_balancer(reconciler)
    # A stream on a connection reused from an earlier request (httpx keeps them)
    # stays on that connection's node; every other one follows its parity.
    assert balancer.served == {i: "a" if i % 2 == 0 else "b" for i in balancer.served}
    assert sum(1 for node in balancer.served.values() if node == "b") >= STREAMS // 2 - 1
    verdicts = {s.index: (s.verdict, s.reason) for s in result.model.streams}
    assert verdicts == {i: ("exact", None) for i in range(STREAMS)}
    assert result.exit_code == 0
    # Each node claimed the requests it served, and kept only theirs.
    assert hub_a["claims"] + hub_b["claims"] == STREAMS
    for hub in (hub_a, hub_b):
        assert hub["claims"] > 0 and hub["accepted"] > 0, hub
        assert hub["unclaimed"] == 0 and hub["dropped"] == 0 and hub["incomplete"] == 0
        assert hub["waits"] == hub["claims"] and hub["open_claims"] == 0
