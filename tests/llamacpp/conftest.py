"""Fixtures for the live llama.cpp tier: the llama-server binary (built once, cached
outside the tree by build_server.sh), the tests' tiny model as GGUF, servers (always
killed). Every test here is marked `llamacpp` (`make llamacpp-test`; tests/conftest.py),
and shares the socket and log folders of tests/conftest.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "vllm"), str(HERE.parent)]

import llama_server  # noqa: E402


@pytest.fixture(scope="session")
def llama_binary() -> Path:
    return llama_server.build()


@pytest.fixture(scope="session")
def gguf(llama_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return llama_server.build_gguf(tmp_path_factory.mktemp("gguf"))
