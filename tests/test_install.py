"""The README's installs, from what `make dist` built, in fresh venvs outside the tree
(`make install-test`; marker `install`): a GPU server takes the plugin alone (its
wheel, or a git URL with `#subdirectory=plugin`), a laptop the client and the
plugin it needs. Each venv is new, in a temporary directory, and every command
runs from there, so nothing of the checkout is importable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

pytestmark = pytest.mark.install

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dist"
# The development build's test kit (rust/py feature `testkit`, `make native`).
TEST_KIT = ("decode_frame", "sse_inputs", "read_sse_body", "pack_inputs")
# The CPython versions the client's abi3 wheel is said to run on (pyenv here and in CI).
PYENV = Path.home() / ".pyenv" / "versions"


def _one(pattern: str) -> Path:
    found = sorted(DIST.glob(pattern))
    assert len(found) == 1, f"{pattern} in {DIST}: {found} (run make dist)"
    return found[0]


def _metadata(wheel: Path) -> tuple[object, list[str]]:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(archive.read(meta).decode()), names


def _venv(where: Path, python: str = sys.executable) -> Path:
    subprocess.run([python, "-m", "venv", str(where)], check=True, cwd=where.parent)
    return where / "bin"


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    result = subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=900, env={**clean, **env}
    )
    assert result.returncode == 0, f"{args}: {result.stdout[-2000:]}{result.stderr[-2000:]}"
    return result


def _pip(bin_dir: Path, cwd: Path, *args: str) -> None:
    # No cache: a wheel pip built from an older sdist of the same version must not
    # stand in for this tree's (it did, before this flag: a 0.3.0 without a new name).
    _run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-cache-dir",
          "--disable-pip-version-check", *args], cwd)  # fmt: skip


# Checked in the server's venv: the entry points vLLM loads, and that nothing happens
# without PARALLELHUE_VLLM_EXACT=1 (vLLM is not even imported).
_SERVER_CHECK = """
import json, sys
from importlib.metadata import entry_points, version
import parallelhue_vllm
from parallelhue_vllm import plugin, wire
plugin.register()
print(json.dumps({
    "version": version("parallelhue-vllm"),
    "file": parallelhue_vllm.__file__,
    "general": [e.value for e in entry_points(group="vllm.general_plugins")],
    "endpoint": [e.value for e in entry_points(group="vllm.endpoint_plugins")],
    "protocol": wire.PROTOCOL_VERSION,
    "vllm_imported": "vllm" in sys.modules,
}))
"""


def _check_server(bin_dir: Path, cwd: Path) -> None:
    found = json.loads(_run([str(bin_dir / "python"), "-c", _SERVER_CHECK], cwd).stdout)
    assert found["general"] == ["parallelhue_vllm.plugin:register"]
    assert found["endpoint"] == ["parallelhue_vllm.endpoint:ParallelHueEndpoint"]
    assert found["file"].startswith(str(cwd))  # the venv's copy, not the checkout's
    assert found["vllm_imported"] is False
    # Protocol N is spoken by parallelhue-vllm 0.N.
    assert found["version"].split(".")[1] == str(found["protocol"])
    # The self-check the README says to run first ships with it (here without vLLM).
    check = subprocess.run(
        [str(bin_dir / "python"), "-m", "parallelhue_vllm", "check"],
        cwd=cwd, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert check.returncode == 1, check.stderr
    assert "problem: PARALLELHUE_VLLM_EXACT is not set" in check.stdout
    assert "problem: vLLM does not import" in check.stdout


def test_dist_holds_the_wheels_and_sdists_with_their_metadata() -> None:
    client, client_files = _metadata(_one("parallelhue-*.whl"))
    plugin, plugin_files = _metadata(_one("parallelhue_vllm-*.whl"))
    assert client["Requires-Dist"] is not None
    requires = client.get_all("Requires-Dist")  # type: ignore[attr-defined]
    assert "parallelhue-vllm>=0.3,<0.4" in requires
    for meta, files in ((client, client_files), (plugin, plugin_files)):
        classifiers = meta.get_all("Classifier")  # type: ignore[attr-defined]
        assert "Programming Language :: Python :: 3.11" in classifiers
        assert any(name.endswith("LICENSE") for name in files), files
    assert plugin["License-Expression"] == "Apache-2.0"  # type: ignore[index]
    client_sdist = ("LICENSE", "rust/core/Cargo.toml", "python/parallelhue/cli/command.py")
    plugin_sdist = ("LICENSE", "parallelhue_vllm/wire.py", "pyproject.toml")
    for sdist, inside in (
        (_one("parallelhue-*.tar.gz"), client_sdist),
        (_one("parallelhue_vllm-*.tar.gz"), plugin_sdist),
    ):
        with tarfile.open(sdist) as archive:
            names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
        assert set(inside) <= names, (sdist, sorted(names)[:40])


def test_gpu_server_installs_the_plugin_wheel_alone(tmp_path: Path) -> None:
    bin_dir = _venv(tmp_path / "server")
    _pip(bin_dir, tmp_path, str(_one("parallelhue_vllm-*.whl")))
    _check_server(bin_dir, tmp_path)


def test_gpu_server_installs_the_plugin_from_a_git_url(tmp_path: Path) -> None:
    """`pip install "git+URL#subdirectory=plugin"` (here the checkout's own repository,
    a file URL: the same clone and build as from a server, offline)."""
    bin_dir = _venv(tmp_path / "server")
    _pip(bin_dir, tmp_path, f"git+file://{ROOT}#subdirectory=plugin")
    _check_server(bin_dir, tmp_path)


def _pythons() -> list[str]:
    """The running Python, and 3.12 and 3.13 where pyenv has them (this machine, CI)."""
    found = [sys.executable]
    for minor in ("3.12", "3.13"):
        candidates = sorted(PYENV.glob(f"{minor}.*/bin/python"))
        if candidates:
            found.append(str(candidates[-1]))
    return found


@pytest.mark.parametrize("python", _pythons(), ids=lambda p: Path(p).parent.parent.name)
def test_laptop_installs_the_client_and_runs_the_demo(python: str, tmp_path: Path) -> None:
    bin_dir = _venv(tmp_path / "laptop", python)
    # The README's command: the client's file, the plugin found beside it (its wheel
    # where it fits this Python, else its sdist).
    _pip(bin_dir, tmp_path, "--find-links", str(DIST), str(_one("parallelhue-*.whl")))
    version = _run([str(bin_dir / "parallelhue"), "--version"], tmp_path).stdout
    assert version.startswith("parallelhue ")
    # What ships has no test support (rust/py's `testkit` feature is for `make native`).
    kit = f"import parallelhue._native as n; print([f for f in {TEST_KIT!r} if hasattr(n, f)])"
    assert _run([str(bin_dir / "python"), "-c", kit], tmp_path).stdout.strip() == "[]"
    demo = _run(
        [str(bin_dir / "parallelhue"), "demo", "--concurrency", "2", "--max-tokens", "24",
         "--step-ms", "1", "--mode", "exact", "--json"],
        tmp_path,
        PARALLELHUE_SOCKET_DIR=str(tmp_path / "sock"),
    )  # fmt: skip
    document = json.loads(demo.stdout)
    assert document["exit_code"] == 0
    assert [s["label"] for s in document["streams"]] == ["EXACT TOKEN PROVENANCE"] * 2


def test_the_client_wheel_alone_names_the_plugin_it_needs(tmp_path: Path) -> None:
    """Without the plugin's file no index serves parallelhue-vllm: pip says which."""
    bin_dir = _venv(tmp_path / "laptop")
    result = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "--no-index",
         "--disable-pip-version-check", str(_one("parallelhue-*.whl"))],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0
    assert "parallelhue-vllm<0.4,>=0.3" in result.stderr
