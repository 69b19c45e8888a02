"""Server-reported steps through a fleet: SIMULATED stock vLLM replicas (no plugin,
`--stock vllm`: per-step lists in the final usage chunk) behind the real
`vllm-router` (PyPI) with `round_robin`, the real `parallelhue` on another
network host with nothing but the router's URL. The router forwards each
response as it is, so every stream's own lists reach the client and every
stream shows `SERVER-REPORTED STEPS` whichever replica served it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleet import NEEDS_ROUTER, simulated_fleet

from netns import Hosts, require_root

PYTHON = sys.executable
REPLICAS = 2
STREAMS = 16

pytestmark = [
    pytest.mark.skipif(bool(require_root()), reason=require_root() or ""),
    NEEDS_ROUTER,
]


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[Hosts, str]]:
    with simulated_fleet("fleet-stock", REPLICAS, 9101, ["--stock", "vllm", "--step-ms", "4"]) as (
        hosts,
        router_url,
        _,
    ):
        yield hosts, router_url


def test_stock_replicas_behind_the_router_show_their_own_steps(
    fleet: tuple[Hosts, str],
) -> None:
    hosts, router_url = fleet
    home = tempfile.mkdtemp(prefix="phfleet-cli", dir="/tmp")
    try:
        argv = hosts.command(
            hosts.client, PYTHON, "-m", "parallelhue", "hi",
            "--endpoint", router_url + "/v1/chat/completions", "--view", "plain",
            "--concurrency", str(STREAMS), "--max-tokens", "80", "--json",
        )  # fmt: skip
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    streams = json.loads(done.stdout)["streams"]
    assert [s["label"] for s in streams] == ["SERVER-REPORTED STEPS"] * STREAMS
    for stream in streams:
        assert stream["evidence"] == "server-reported" and stream["reported"]["fits"]
        assert stream["reported"]["engine"] == "vLLM"
    colored = sum(s["reported"]["colored_bytes"] for s in streams)
    print(
        f"\nstock vLLM (SIMULATED) behind vllm-router, {REPLICAS} replicas, {STREAMS} "
        f"streams: all server-reported, {colored} bytes colored"
    )
