"""A real vLLM server WITHOUT the plugin: auto mode downgrades visibly, exact mode refuses.

Runs the client CLI (`python -m parallelhue`) from the project venv against a
vLLM server whose telemetry plugin is not enabled.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import server

pytestmark = pytest.mark.vllm

PROMPT = "東京は日本の首都です。 def add(x, y): return x + y"


@pytest.fixture(scope="module")
def plain_server(tiny_model: Path, socket_dir: str, logs_dir: Path) -> Iterator[server.Server]:
    srv = server.start(
        tiny_model,
        logs_dir / "server-noplugin.log",
        speculative=dict(server.NGRAM),
        plugin=False,
        socket_dir=socket_dir,
    )
    try:
        yield srv
    finally:
        srv.stop()


def run_cli(srv: server.Server, mode: str, socket_dir: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PARALLELHUE_SOCKET_DIR": socket_dir, "NO_COLOR": "1"}
    endpoint = srv.url + "/v1/chat/completions"
    command = [sys.executable, "-m", "parallelhue", "--endpoint", endpoint, "--mode", mode]
    command += ["--max-tokens", "16", "--concurrency", "2", PROMPT]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_exact_mode_exits_2_naming_missing_telemetry(
    plain_server: server.Server, socket_dir: str
) -> None:
    result = run_cli(plain_server, "exact", socket_dir)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "missing telemetry" in result.stdout + result.stderr


def test_auto_mode_downgrades_to_sse_chunk_mode(
    plain_server: server.Server, socket_dir: str
) -> None:
    result = run_cli(plain_server, "auto", socket_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SSE CHUNK MODE" in result.stdout
    assert "EXACT TOKEN PROVENANCE" not in result.stdout
