"""https endpoints: the Rust HTTP thread does TLS itself (rustls), trusting a
private CA given with SSL_CERT_FILE, and refuses an unknown issuer in one line.

A throwaway CA and a server certificate for 127.0.0.1 are made with the
`openssl` command (a Debian package CI installs, .ci/apt-packages).
"""

from __future__ import annotations

import os
import re
import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from client_fakes import FakeServer

ROOT = Path(__file__).resolve().parent.parent

if shutil.which("openssl") is None:
    if os.environ.get("CI"):
        raise RuntimeError("openssl is missing: .ci/apt-packages installs it")
    pytest.skip("needs the openssl command", allow_module_level=True)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("tls")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=ParallelHue test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)  # fmt: skip
    _openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=127.0.0.1", cwd=d)  # fmt: skip
    (d / "ext.cnf").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf",
             cwd=d)  # fmt: skip
    yield d


def _server_context(certs: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs / "server.pem", certs / "server.key")
    return context


def _run(url: str, reconciler: str, env_extra: dict[str, str], *extra: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PARALLELHUE_", "SSL_CERT"))}
    env.update(env_extra)
    env["PYTHONPATH"] = str(ROOT / "python")
    env["NO_COLOR"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "parallelhue", "hi", "--endpoint", url + "/v1/chat/completions",
         "--mode", "chunk", "--view", "plain", "--reconciler", reconciler, *extra],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("reconciler", ["rust", "python"])
def test_a_private_ca_given_with_ssl_cert_file_is_trusted(certs: Path, reconciler: str) -> None:
    with FakeServer(tls=_server_context(certs)) as server:
        code, out, err = _run(server.url, reconciler, {"SSL_CERT_FILE": str(certs / "ca.pem")})
        request = server.requests[0]
    assert code == 0, err
    assert "Hello world!" in out and re.search(r"^#0 +CHUNK +4 ", out, re.M), out
    assert request["model"] == "fake-model"  # /v1/models over https too
    assert request["_headers"]["x-request-id"] == request["request_id"]


def test_an_unknown_issuer_fails_the_stream_in_one_line(certs: Path) -> None:
    with FakeServer(tls=_server_context(certs)) as server:
        code, _out, err = _run(server.url, "rust", {}, "--model", "m")
        port = server.port
    assert code == 2  # nothing connected: the run never started (a setup problem)
    assert err == (
        f"parallelhue: 1 of 1 streams failed; stream 0: TLS failure with 127.0.0.1:{port}: "
        "invalid peer certificate: UnknownIssuer "
        "(to trust a private CA: SSL_CERT_FILE=/path/to/ca.pem)\n"
    )
