"""Data parallel across nodes, as it is today (docs/REACH.md, "Multi-node data
parallel"): one run's requests spread over two nodes, each with its own API
server and hub, behind one load balancer (vLLM's hybrid or external load
balancing, `--data-parallel-hybrid-lb` / `--data-parallel-external-lb`).

Two SIMULATED engines stand for the nodes (each its own process-wide hub
scope, as two hosts would have) and a small HTTP load balancer in front sends
the telemetry subscription and the even streams to node A, the odd streams to
node B. Node B's hub has no subscriber for the run, so it discards the run's
frames (`unclaimed`): the streams B served must never be EXACT, and the
streams A served are. Nothing here makes remote nodes reach the hub (that is
not built); this pins down that the gap fails visibly.
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
    the telemetry route and even streams to `a`, odd streams to `b`."""

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
def test_streams_served_by_a_node_without_the_subscription_are_never_exact(
    reconciler: str,
) -> None:
    result, balancer, (hub_a, hub_b) = run_behind_balancer(reconciler)
    assert balancer.served == {i: "a" if i % 2 == 0 else "b" for i in range(STREAMS)}
    verdicts = {s.index: (s.verdict, s.reason) for s in result.model.streams}
    for stream, node in balancer.served.items():
        if node == "a":
            assert verdicts[stream] == ("exact", None)
        else:
            assert verdicts[stream] == (
                "failed",
                "missing telemetry: no provenance for offset 0",
            ), stream
    assert result.exit_code == 2
    # Node B saw the run's frames and, with no subscriber for it, kept none of them.
    assert hub_b["unclaimed"] > 0 and hub_b["accepted"] == 0
    assert hub_a["accepted"] > 0 and hub_a["subscriptions"] == 1 and hub_b["subscriptions"] == 0
