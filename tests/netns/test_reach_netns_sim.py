"""Across two hosts (network namespaces joined by a veth pair) with the SIMULATED engine:
the engine runs on the server host as another uid (65534) behind an API key, the real
`parallelhue` command runs on the client host, and nothing is shared but the URL and
the key — no socket directory, no file. The real-vLLM twin is
tests/vllm/test_reach_netns.py; tests/netns/netns.py makes and removes the hosts."""

from __future__ import annotations

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

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import reach_client as rc
from netns import Hosts, require_root

PYTHON = sys.executable
KEY = "netns-sim-key"
PORT = 8000

pytestmark = pytest.mark.skipif(bool(require_root()), reason=require_root() or "")


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    with Hosts() as made:
        yield made


@pytest.fixture(scope="module")
def server_home() -> Iterator[str]:
    """The engine's own directory (its hub), owned by the engine's uid."""
    home = tempfile.mkdtemp(prefix="phns-srv", dir="/tmp")
    os.chown(home, 65534, 65534)
    yield home
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def engine(hosts: Hosts, server_home: str) -> Iterator[str]:
    """`python -m parallelhue.sim` on the server host as uid 65534; its URL."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": server_home,
        "PARALLELHUE_HUB_DIR": os.path.join(server_home, "hub"),
    }
    process = subprocess.Popen(
        hosts.command(
            hosts.server, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
            PYTHON, "-m", "parallelhue.sim", "--host", hosts.server_ip, "--port", str(PORT),
            "--telemetry", "http", "--api-key", KEY, "--step-ms", "2",
        ),
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    url = f"http://{hosts.server_ip}:{PORT}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                got = hosts.call(
                    hosts.client, lambda: rc.request(url, "GET", "/v1/models", api_key=KEY)
                )
                if got.status == 200:
                    break
            except OSError:
                pass
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "the engine did not start on the server host"
            time.sleep(0.1)
        yield url
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(10)


def client(
    hosts: Hosts, url: str, *args: str, home: str, wait: bool = True
) -> subprocess.CompletedProcess[str] | subprocess.Popen[str]:
    """The real `parallelhue` on the client host: a fresh HOME and socket directory of its
    own, no PARALLELHUE_* variable; only the URL (and the flags)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        "PARALLELHUE_SOCKET_DIR": os.path.join(home, "sockets"),
    }
    argv = hosts.command(
        hosts.client, PYTHON, "-m", "parallelhue", "--endpoint",
        url + "/v1/chat/completions", "--view", "plain", *args,
    )  # fmt: skip
    if not wait:
        return subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)


@pytest.fixture
def home() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="phns-cli", dir="/tmp")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def hub(hosts: Hosts, url: str) -> dict[str, Any]:
    got = hosts.call(hosts.client, lambda: rc.request(url, "GET", rc.PROBE_PATH, api_key=KEY))
    assert got.status == 200
    return dict(got.json()["hub"])


def test_16_streams_are_exact_with_nothing_shared_but_the_url(
    hosts: Hosts, engine: str, home: str
) -> None:
    done = client(
        hosts, engine, "hi", "--api-key", KEY, "--mode", "exact", "--concurrency", "16",
        "--max-tokens", "48", home=home,
    )  # fmt: skip
    assert isinstance(done, subprocess.CompletedProcess)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.count("EXACT TOKEN PROVENANCE ·") == 16
    banner = done.stdout.splitlines()[0]
    assert (
        f"telemetry: {hosts.server_ip}:{PORT} over plain HTTP: NOT encrypted, anyone on the "
        "network path can read or forge it; API key sent in clear, in-band, run "
    ) in banner
    assert banner.endswith("… (auto)")
    # The client made no socket directory: telemetry came over the URL only.
    assert not os.path.exists(os.path.join(home, "sockets"))


def test_a_wrong_key_across_hosts_is_one_line_and_exit_2(
    hosts: Hosts, engine: str, home: str
) -> None:
    done = client(hosts, engine, "hi", "--api-key", "nope", "--model", "parallelhue-sim", home=home)
    assert isinstance(done, subprocess.CompletedProcess)
    assert (done.returncode, done.stderr) == (
        2,
        f"parallelhue: error: the server refused the API key (HTTP 401 from {engine}"
        "/v1/parallelhue): check --api-key or OPENAI_API_KEY\n",
    )


def test_a_killed_client_frees_the_hub_and_the_next_run_is_exact(
    hosts: Hosts, engine: str, home: str
) -> None:
    before = hub(hosts, engine)
    assert (before["open_claims"], before["buffered_bytes"]) == (0, 0)
    running = client(
        hosts, engine, "hi", "--api-key", KEY, "--concurrency", "8", "--max-tokens", "4000",
        home=home, wait=False,
    )  # fmt: skip
    assert isinstance(running, subprocess.Popen)
    try:
        deadline = time.monotonic() + 30
        while hub(hosts, engine)["accepted"] - before["accepted"] < 50:
            assert time.monotonic() < deadline, "the client's telemetry never flowed"
            time.sleep(0.05)
        assert hub(hosts, engine)["open_claims"] == 8
    finally:
        running.kill()  # no goodbye: the connections just die
        running.wait(10)
    deadline = time.monotonic() + 30
    while True:
        after = hub(hosts, engine)
        if (after["open_claims"], after["buffered_bytes"]) == (0, 0):
            break
        assert time.monotonic() < deadline, after
        time.sleep(0.1)
    nxt = client(
        hosts, engine, "hi", "--api-key", KEY, "--mode", "exact", "--concurrency", "4",
        "--max-tokens", "32", home=home,
    )  # fmt: skip
    assert isinstance(nxt, subprocess.CompletedProcess)
    assert (nxt.returncode, nxt.stderr) == (0, "")
    assert nxt.stdout.count("EXACT TOKEN PROVENANCE ·") == 4
