"""What every test tier shares: the live tiers' markers by folder, a short socket
directory, and a folder for server logs."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# Every test in these folders needs a real engine: `-m vllm` / `-m llamacpp` select them.
_TIER_OF_FOLDER = {HERE / "vllm": "vllm", HERE / "llamacpp": "llamacpp"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = _TIER_OF_FOLDER.get(Path(str(item.fspath)).resolve().parent)
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(scope="session")
def socket_dir() -> Iterator[str]:
    # Short: pytest's tmp paths can exceed the AF_UNIX limit.
    directory = tempfile.mkdtemp(prefix="phsock-", dir="/tmp")
    os.chmod(directory, 0o700)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def logs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server-logs")
