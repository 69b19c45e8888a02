"""Start and stop a real vLLM OpenAI server on the CPU for the `vllm` tier and the benchmark.

Used from the project venv; the server runs in $PARALLELHUE_VLLM_VENV (see
setup_venv.sh). Servers listen on 127.0.0.1 on a free port and are always
killed (whole process group) by `stop()`.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENV = Path.home() / ".cache" / "parallelhue" / "vllm-0.32.0"
START_TIMEOUT = 300.0

NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 2,
}


_LIVE: list[Server] = []
_HOOKED: list[bool] = []


def _stop_all() -> None:
    for live in list(_LIVE):
        live.stop()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # Turn SIGTERM (e.g. from `timeout`) into a normal exit so servers are stopped.
    raise SystemExit(128 + signum)


def _die_with_parent() -> None:
    """In the server's process: get SIGTERM when the test process dies, however it dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def vllm_venv() -> Path:
    return Path(os.environ.get("PARALLELHUE_VLLM_VENV") or DEFAULT_VENV)


def vllm_python() -> Path:
    return vllm_venv() / "bin" / "python"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def build_model(out_dir: Path, tokenizer: str = "byte-level") -> Path:
    """Build the tiny model once into out_dir (reused when already built);
    `tokenizer`: "byte-level" or "byte-fallback" (see build_tiny_model.py)."""
    if not (out_dir / "BUILT").exists():
        subprocess.run(
            [
                str(vllm_python()),
                str(REPO / "tests" / "vllm" / "build_tiny_model.py"),
                str(out_dir),
                tokenizer,
            ],
            check=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    return out_dir


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    model: str = "tiny"
    extra: dict[str, str] = field(default_factory=dict)

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self in _LIVE:
            _LIVE.remove(self)
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                return
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        else:
            # The server exited; its children (EngineCore, worker) may not have.
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def generated_tokens(metrics: str) -> float:
    """vLLM's count of the tokens it generated, from the text of its /metrics."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("vllm:generation_tokens_total")
    )


def install_cleanup() -> None:
    """Kill every server at exit and on SIGTERM; call from the main thread before
    starting servers from other threads (signal handlers are the main thread's)."""
    if not _HOOKED:
        _HOOKED.append(True)
        atexit.register(_stop_all)
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _exit_on_sigterm)


def start(
    model_dir: Path,
    log_path: Path,
    *,
    speculative: dict[str, object] | None,
    plugin: bool,
    socket_dir: str | None = None,
    env: dict[str, str] | None = None,
    max_num_seqs: int = 32,
    extra_args: list[str] | None = None,
    serve: bool = False,
    tls: tuple[str, str] | None = None,
    prefix: Sequence[str] = (),
    python: Path | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    healthy: Callable[[str], bool] | None = None,
    ca: str | None = None,
) -> Server:
    """Start a server and wait until /health answers; raises with the log tail on failure.

    `serve`: start it as `vllm serve` (needed for --api-server-count > 1);
    `tls`: (certfile, keyfile), served as https and checked against `ca` (default:
    certfile itself, a self-signed certificate);
    `prefix`: run the command under it (e.g. `ip netns exec NS setpriv ...`);
    `python`: the interpreter (default: the vLLM venv's); `host`, `port`: where it
    listens (default 127.0.0.1, a free port); `healthy(url)`: whether it is up
    (default: GET /health from here).
    """
    port = free_port() if port is None else port
    entry = (
        [str(REPO / "tests" / "vllm" / "vllm_serve.py"), str(model_dir)]
        if serve
        else ["-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
    )
    args = [
        *prefix, str(python or vllm_python()), *entry, "--served-model-name", "tiny",
        "--host", host, "--port", str(port),
        "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
        "--max-num-seqs", str(max_num_seqs),
    ]  # fmt: skip
    if speculative is not None:
        args += ["--speculative-config", json.dumps(speculative)]
    if tls is not None:
        args += ["--ssl-certfile", tls[0], "--ssl-keyfile", tls[1]]
    args += extra_args or []
    child_env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "PARALLELHUE_E2E_CPU_FIX": "1",
        "PYTHONUNBUFFERED": "1",
    }
    child_env.pop("PARALLELHUE_VLLM_EXACT", None)
    # Each server picks its own hub scope (a test process may carry one from register()).
    child_env.pop("PARALLELHUE_HUB_SCOPE", None)
    if plugin:
        child_env["PARALLELHUE_VLLM_EXACT"] = "1"
    if socket_dir is not None:
        child_env["PARALLELHUE_SOCKET_DIR"] = socket_dir
    child_env.update(env or {})
    log = open(log_path, "wb")
    install_cleanup()
    process = subprocess.Popen(
        args,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=child_env,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    log.close()
    scheme = "https" if tls is not None else "http"
    server = Server(f"{scheme}://{host}:{port}", process, log_path)
    _LIVE.append(server)
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(
                    f"vLLM server exited with {process.returncode}:\n{server.log_tail()}"
                )
            try:
                if healthy is not None:
                    if healthy(server.url):
                        return server
                else:
                    verify = (
                        ssl.create_default_context(cafile=ca or tls[0]) if tls is not None else True
                    )
                    response = httpx.get(server.url + "/health", timeout=2, verify=verify)
                    if response.status_code == 200:
                        return server
            except (httpx.HTTPError, OSError):
                pass
            time.sleep(1)
        raise RuntimeError(
            f"vLLM server not healthy after {START_TIMEOUT:.0f} s:\n{server.log_tail()}"
        )
    except BaseException:
        server.stop()
        raise


def start_on_server_host(
    hosts: Any,
    model_dir: Path,
    log_path: Path,
    *,
    port: int,
    hub_dir: Path,
    extra_args: Sequence[str] = (),
    serve: bool = False,
) -> Server:
    """A server with the plugin (its hub in `hub_dir`) and ngram K=3 on the server host
    of `hosts` (a tests/netns/netns.py `Hosts`), on its loopback at `port`."""

    def healthy(url: str) -> bool:
        status = hosts.call(hosts.server, lambda: httpx.get(url + "/health", timeout=3).status_code)
        return bool(status == 200)

    return start(
        model_dir,
        log_path,
        speculative=dict(NGRAM),
        plugin=True,
        env={
            "VLLM_PLUGINS": "parallelhue,parallelhue_e2e_fixes",
            "PARALLELHUE_HUB_DIR": str(hub_dir),
        },
        serve=serve,
        extra_args=list(extra_args),
        prefix=hosts.command(hosts.server),
        port=port,
        healthy=healthy,
    )


@contextmanager
def on_server_host(
    hosts: Any, model_dir: Path, log_prefix: Path, specs: dict[str, dict[str, Any]]
) -> Iterator[dict[str, Server]]:
    """`start_on_server_host` for each name and keyword arguments in `specs`, one after
    the other in this thread (a server dies with the thread that started it: it gets
    PR_SET_PDEATHSIG), logs at `<log_prefix><name>.log`; all stopped at the end."""
    started: dict[str, Server] = {}
    try:
        for name, spec in specs.items():
            log = log_prefix.with_name(f"{log_prefix.name}{name}.log")
            started[name] = start_on_server_host(hosts, model_dir, log, **spec)
        yield started
    finally:
        for srv in started.values():
            srv.stop()


if __name__ == "__main__":  # manual smoke start: python tests/vllm/server.py MODEL_DIR
    srv = start(Path(sys.argv[1]), Path("/tmp/ph-vllm-server.log"), speculative=NGRAM, plugin=True)
    print(srv.url, flush=True)
    try:
        srv.process.wait()
    finally:
        srv.stop()
