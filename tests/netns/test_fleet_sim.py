"""A fleet of SIMULATED engines behind vllm-router (docs/REACH.md, "Fleets"): three
replicas on the server host, each its own process and hub, behind the real
`vllm-router` (PyPI) with `round_robin`; the real `parallelhue` on the client host
with 64 streams, nothing shared but the router's URL. Each request's telemetry
rides inside its own response, so every stream is EXACT whichever replica served
it and no frame is lost; each replica's hub claimed exactly the requests it
served. The real-vLLM fleet: tests/vllm/test_fleet.py."""

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

from fleet import NEEDS_ROUTER, hub, simulated_fleet

from netns import Hosts, require_root

PYTHON = sys.executable
REPLICAS = 3
STREAMS = 64

pytestmark = [
    pytest.mark.skipif(bool(require_root()), reason=require_root() or ""),
    NEEDS_ROUTER,
]


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[Hosts, str, list[str]]]:
    with simulated_fleet(
        "fleet-sim", REPLICAS, 9001, ["--telemetry", "http", "--step-ms", "4"]
    ) as made:
        yield made


def test_64_streams_over_round_robin_are_all_exact_with_no_frame_lost(
    fleet: tuple[Hosts, str, list[str]],
) -> None:
    hosts, router_url, replicas = fleet
    before = [hub(hosts, url) for url in replicas]
    home = tempfile.mkdtemp(prefix="phfleet-cli", dir="/tmp")
    try:
        argv = hosts.command(
            hosts.client, PYTHON, "-m", "parallelhue", "hi",
            "--endpoint", router_url + "/v1/chat/completions", "--view", "plain",
            "--mode", "exact", "--concurrency", str(STREAMS), "--max-tokens", "96", "--json",
        )  # fmt: skip
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)  # --json: the result on stdout, the screen on stderr
    assert [s["verdict"] for s in result["streams"]] == ["exact"] * STREAMS
    counters = result["telemetry"]
    assert counters["gaps"] == 0 and counters["dropped_reported"] == 0
    assert counters["rejected_frames"] == 0
    # Another host, no probe needed: the banner says in-band.
    assert result["run_messages"] == []
    after = [hub(hosts, url) for url in replicas]
    claims = [a["claims"] - b["claims"] for a, b in zip(after, before, strict=True)]
    # round_robin: every replica served its share (the router's own health checks
    # and model listing are not claims).
    assert sum(claims) == STREAMS and all(c >= STREAMS // REPLICAS - 1 for c in claims), claims
    for a, b in zip(after, before, strict=True):
        assert a["unclaimed"] == b["unclaimed"] and a["dropped"] == b["dropped"]
        assert a["incomplete"] == b["incomplete"] and a["open_claims"] == 0
    print(
        f"\nin-band behind vllm-router ({REPLICAS} SIMULATED replicas, {STREAMS} streams): "
        f"claims per replica {claims}; end of stream waited at most "
        f"{max(a['wait_us_max'] for a in after) / 1000:.1f} ms"
    )
