"""A fleet on the server host of tests/netns/netns.py: replicas behind vllm-router,
optionally behind nginx with TLS (docs/REACH.md, "Fleets").

- `router_binary()`: vllm-router from PyPI, installed by `make router-venv` into
  `~/.cache/parallelhue/router-venv` (or `PARALLELHUE_VLLM_ROUTER`), its real
  entry point (a Rust extension behind a Python launcher).
- `start_router(hosts, port, workers, log)`: `vllm-router --policy round_robin` on
  the server host, waited for until it answers; with `prefill_decode`, its vLLM
  prefill/decode mode in front of one prefill and one decode worker.
- `simulated_fleet(name, replicas, first_port, sim_args)`: simulated engines
  behind vllm-router in fresh namespaces, removed at the end.
- `NEEDS_ROUTER`: the skip mark of every test that starts vllm-router.
- `throwaway_ca(directory, ip)`: a CA and a certificate for `ip` signed by it
  (three `openssl` commands, as tests/test_tls.py makes them).
- `start_nginx(hosts, directory, port, upstream, certs)`: nginx (the Debian
  package) as a TLS reverse proxy with buffering off, its config, pid and logs
  in `directory`.

Every process is started with `start_new_session` inside the namespace, so
`Hosts.close()` (which kills what runs inside) removes it; `stop()` kills the
process group first.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import reach_client as rc
from netns import Hosts

__all__ = [
    "NEEDS_ROUTER",
    "Proc",
    "answers",
    "hub",
    "hubs",
    "router_binary",
    "simulated_fleet",
    "start_nginx",
    "start_router",
    "throwaway_ca",
    "wait_until",
]


def hub(hosts: Hosts, url: str) -> dict[str, Any]:
    """The in-band hub counters (docs/PROTOCOL.md, the probe) of the API-server process
    at `url` that answered, asked from the server host."""
    got = hosts.call(hosts.server, lambda: rc.request(url, "GET", rc.PROBE_PATH))
    assert got.status == 200, got
    return dict(got.json()["hub"])


def hubs(hosts: Hosts, url: str, processes: int) -> dict[int, dict[str, Any]]:
    """The hub of each of the `processes` API-server processes at `url` (fresh
    connections until all answered), by process id."""
    seen: dict[int, dict[str, Any]] = {}
    for attempt in range(400):
        counters = hub(hosts, url)
        seen[counters["process"]] = counters
        if len(seen) == processes:
            return seen
        if attempt % 20 == 19:
            time.sleep(0.2)  # the kernel spreads new connections; an idle moment helps
    raise AssertionError(f"the probe reached {len(seen)} of {processes} API-server processes")


ROUTER_VENV = Path.home() / ".cache" / "parallelhue" / "router-venv"


@dataclass
class Proc:
    """A process started in a namespace (its own session)."""

    process: subprocess.Popen[bytes]
    log: Path

    def __enter__(self) -> Proc:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)

    def kill(self) -> None:
        """SIGKILL the whole group, no goodbye (a replica that dies)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def router_binary() -> str | None:
    """The vllm-router command, or None (`make router-venv` installs it)."""
    explicit = os.environ.get("PARALLELHUE_VLLM_ROUTER")
    if explicit:
        return explicit
    candidate = ROUTER_VENV / "bin" / "vllm-router"
    return str(candidate) if candidate.exists() else shutil.which("vllm-router")


NEEDS_ROUTER = pytest.mark.skipif(
    router_binary() is None, reason="vllm-router is not installed: run `make router-venv`"
)


def answers(hosts: Hosts, host: str, url: str) -> Callable[[], bool]:
    """Whether `url` serves /v1/models to `host` (a readiness check)."""
    return lambda: hosts.call(host, lambda: rc.request(url, "GET", "/v1/models").status == 200)


def wait_until(check: Callable[[], bool], what: str, proc: Proc, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:  # not listening yet (OSError, httpx's errors)
            pass
        if proc.process.poll() is not None:
            raise AssertionError(f"{what} exited: {proc.log_tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not up after {timeout:.0f} s: {proc.log_tail()}")
        time.sleep(0.2)


def spawn(hosts: Hosts, argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> Proc:
    with open(log, "wb") as out:
        process = subprocess.Popen(
            hosts.command(hosts.server, *argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    return Proc(process, log)


def start_router(
    hosts: Hosts,
    port: int,
    workers: Sequence[str],
    log: Path,
    *,
    prefill_decode: tuple[str, str] | None = None,
) -> Proc:
    """`round_robin` over `workers` on the server host, waited for until the client host
    reaches it; with `prefill_decode` (prefill URL, decode URL) its vLLM P/D mode
    instead: each request is prefilled on one and decoded on the other."""
    binary = router_binary()
    assert binary is not None, "vllm-router is not installed: run `make router-venv`"
    argv = [
        binary, "--host", hosts.server_ip, "--port", str(port), "--policy", "round_robin",
        "--log-level", "warning",
        # The fleet's own failures are what the tests look at: no retry elsewhere.
        "--disable-retries",
    ]  # fmt: skip
    if prefill_decode is None:
        argv += ["--worker-urls", *workers]
    else:
        prefill, decode = prefill_decode
        argv += ["--vllm-pd-disaggregation", "--prefill", prefill, "--decode", decode]
    proc = spawn(hosts, argv, log)
    wait_until(
        answers(hosts, hosts.client, f"http://{hosts.server_ip}:{port}"), "vllm-router", proc
    )
    return proc


@contextmanager
def simulated_fleet(
    name: str, replicas: int, first_port: int, sim_args: Sequence[str], router_port: int = 8000
) -> Iterator[tuple[Hosts, str, list[str]]]:
    """(hosts, router URL, replica URLs): `replicas` simulated engines
    (`python -m parallelhue.sim` with `sim_args`, one hub directory) on the server host's
    loopback, behind vllm-router; everything removed at the end."""
    work = Path(tempfile.mkdtemp(prefix=f"ph{name}", dir="/tmp"))
    work.chmod(0o700)
    procs: list[Proc] = []
    try:
        with Hosts() as hosts:
            urls = [f"http://127.0.0.1:{first_port + i}" for i in range(replicas)]
            for i, url in enumerate(urls):
                argv = [sys.executable, "-m", "parallelhue.sim", "--host", "127.0.0.1"]
                argv += ["--port", str(first_port + i), *sim_args]
                env = {"PARALLELHUE_HUB_DIR": str(work / "hub")}
                procs.append(spawn(hosts, argv, work / f"sim{i}.log", env=env))
                wait_until(answers(hosts, hosts.server, url), f"replica {i}", procs[-1])
            procs.append(start_router(hosts, router_port, urls, work / "router.log"))
            yield hosts, f"http://{hosts.server_ip}:{router_port}", urls
    finally:
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(work, ignore_errors=True)


def throwaway_ca(directory: Path, ip: str) -> Path:
    """ca.pem, server.pem and server.key for `ip` in `directory`."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=ParallelHue fleet test CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", f"/CN={ip}")
    (directory / "ext.cnf").write_text(
        f"subjectAltName=IP:{ip}\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2",
            "-extfile", "ext.cnf")  # fmt: skip
    return directory / "ca.pem"


NGINX_CONF = """\
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 512; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    server {{
        listen {ip}:{port} ssl;
        ssl_certificate {dir}/server.pem;
        ssl_certificate_key {dir}/server.key;
        location / {{
            proxy_pass {upstream};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            # Server-sent events: every byte on as it comes.
            proxy_buffering off;
            proxy_cache off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


def start_nginx(
    hosts: Hosts, directory: Path, port: int, upstream: str, ready: Callable[[], bool]
) -> Proc:
    conf = directory / "nginx.conf"
    conf.write_text(
        NGINX_CONF.format(dir=directory, ip=hosts.server_ip, port=port, upstream=upstream)
    )
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    proc = spawn(hosts, [nginx, "-c", str(conf), "-g", "daemon off;"], directory / "nginx.log")
    wait_until(ready, "nginx", proc)
    return proc
