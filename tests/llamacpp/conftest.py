"""Fixtures for the live llama.cpp tier: the llama-server binary (built once, cached
outside the tree by build_server.sh), the tests' tiny model as GGUF, servers (always
killed). Every test here is marked `llamacpp` (`make llamacpp-test`)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "vllm"), str(HERE.parent)]

import llama_server  # noqa: E402


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).resolve().parent == HERE:
            item.add_marker(pytest.mark.llamacpp)


@pytest.fixture(scope="session")
def llama_binary() -> Path:
    return llama_server.build()


@pytest.fixture(scope="session")
def gguf(llama_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return llama_server.build_gguf(tmp_path_factory.mktemp("gguf"))


@pytest.fixture(scope="session")
def socket_dir() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="phll-", dir="/tmp")
    os.chmod(directory, 0o700)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def logs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("llama-logs")
