"""Build, convert and run llama-server for the live llama.cpp tier.

The binary comes from build_server.sh (llama.cpp vendored in llama-cpp-python,
CPU only, cached in ~/.cache/parallelhue/llama-server-<version>); the model is
the vLLM tier's tiny random-weight Llama (tests/vllm/build_tiny_model.py, built
with the vLLM venv's python) converted by that llama.cpp's own converter
(convert_gguf.py). Servers listen on 127.0.0.1 on a free port and are killed
(whole process group) by `stop()`, and when the test process dies.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import server as vllm_server  # tests/vllm/server.py: the tiny model, free ports

HERE = Path(__file__).resolve().parent
VERSION = os.environ.get("LLAMACPP_PY_VERSION", "0.3.36")
START_TIMEOUT = 120.0
# Draft-model speculative decoding with the model as its own draft, at most 3
# drafts a step; p-min 0: a random-weight model is never confident, and with
# llama-server's default minimum probability it would draft nothing.
DRAFT_ARGS = ["--spec-type", "draft-simple", "--spec-draft-n-max", "3", "--spec-draft-p-min", "0"]

_LIVE: list[LlamaServer] = []


def cache_dir() -> Path:
    base = os.environ.get("PARALLELHUE_CACHE") or str(Path.home() / ".cache" / "parallelhue")
    return Path(base) / f"llama-server-{VERSION}"


def tree() -> Path:
    return cache_dir() / "src" / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"


def build() -> Path:
    """The llama-server binary: built on the first call (10-47 min on 2 cores), then cached."""
    result = subprocess.run(
        ["bash", str(HERE / "build_server.sh")],
        capture_output=True,
        text=True,
        env={**os.environ, "LLAMACPP_PY_VERSION": VERSION},
    )
    if result.returncode != 0:
        tail = "\n".join(result.stderr.splitlines()[-30:])
        raise RuntimeError(f"building llama-server failed:\n{tail}")
    return Path(result.stdout.strip().splitlines()[-1])


def build_gguf(out_dir: Path) -> Path:
    """The tiny model as GGUF (f32), converted by the server's own llama.cpp tree."""
    hf_dir = vllm_server.build_model(out_dir / "hf")
    gguf = out_dir / "tiny.gguf"
    if not gguf.exists():
        subprocess.run(
            [str(vllm_server.vllm_python()), str(HERE / "convert_gguf.py"), str(tree()),
             str(hf_dir), str(gguf)],
            check=True,
            capture_output=True,
        )  # fmt: skip
    return gguf


@dataclass
class LlamaServer:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self in _LIVE:
            _LIVE.remove(self)
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


def _stop_all() -> None:
    for live in list(_LIVE):
        live.stop()


atexit.register(_stop_all)


def start(
    binary: Path, gguf: Path, log_path: Path, *, slots: int, draft: bool = True
) -> LlamaServer:
    """llama-server on the tiny model with `slots` parallel slots (-np), with
    draft-model speculative decoding (the model drafts for itself) unless `draft`
    is False; waits for /health."""
    port = vllm_server.free_port()
    args = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "-np", str(slots), "-c", str(1024 * slots), "-t", "2", "--no-webui",
            "--alias", "tiny"]  # fmt: skip
    if draft:
        args += ["-md", str(gguf), *DRAFT_ARGS]
    log = open(log_path, "wb")
    process = subprocess.Popen(
        args,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=vllm_server._die_with_parent,
    )
    srv = LlamaServer(f"http://127.0.0.1:{port}", process, log_path)
    _LIVE.append(srv)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            srv.stop()
            raise RuntimeError(f"llama-server exited ({process.returncode}):\n{srv.log_tail()}")
        try:
            if httpx.get(srv.url + "/health", timeout=2).status_code == 200:
                return srv
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    srv.stop()
    raise RuntimeError(f"llama-server did not become healthy:\n{srv.log_tail()}")
