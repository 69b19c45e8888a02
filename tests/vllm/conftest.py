"""Fixtures for the real-vLLM tier: the tiny model, servers (always killed), netns hosts
(the marker and the socket and log folders: tests/conftest.py)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "netns"))

import server

from netns import Hosts, require_root


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    python = server.vllm_python()
    if not python.exists():
        pytest.fail(
            f"no vLLM venv at {server.vllm_venv()}: run `make vllm-venv` "
            "(or set PARALLELHUE_VLLM_VENV)"
        )
    return python


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return server.build_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    """A client host and a server host (network namespaces), one set per module."""
    why = require_root()
    if why is not None:
        pytest.skip(why)
    with Hosts() as made:
        yield made


@pytest.fixture(scope="module")
def work(request: pytest.FixtureRequest) -> Iterator[Path]:
    """Everything of one module's servers and clients (readable by other uids), removed
    at the end."""
    root = Path(tempfile.mkdtemp(prefix=f"ph-{request.module.__name__}-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)
