"""What the packages promise, read from the tree (the installs themselves:
tests/test_install.py, `make install-test`)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from parallelhue_vllm import wire

ROOT = Path(__file__).resolve().parent.parent


def _project(path: Path) -> dict[str, object]:
    with open(path, "rb") as handle:
        project = tomllib.load(handle)["project"]
    assert isinstance(project, dict)
    return project


def test_the_client_pins_the_plugin_release_that_speaks_its_protocol() -> None:
    """Protocol N is spoken by parallelhue-vllm 0.N: the pin admits that line from the
    plugin release beside this client on (0.3.1 added the `(untested)` mark the banner reads)."""
    protocol = wire.PROTOCOL_VERSION
    client = _project(ROOT / "pyproject.toml")
    plugin = _project(ROOT / "plugin" / "pyproject.toml")
    version = str(plugin["version"])
    assert version.startswith(f"0.{protocol}.")
    assert f"parallelhue-vllm>={version},<0.{protocol + 1}" in client["dependencies"]  # type: ignore[operator]


def test_both_distributions_carry_the_license_and_classifiers() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert (ROOT / "plugin" / "LICENSE").read_text(encoding="utf-8") == text
    for path in (ROOT / "pyproject.toml", ROOT / "plugin" / "pyproject.toml"):
        project = _project(path)
        assert "Apache-2.0" in str(project["license"])
        classifiers = project["classifiers"]
        assert isinstance(classifiers, list)
        assert "Programming Language :: Python :: 3.11" in classifiers


def test_the_makefile_installs_the_one_dependency_list() -> None:
    """Issue 27 item 6: `.[dev]` from pyproject.toml, no list of its own."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    installs = re.findall(r"\$\(PIP\) install ([^\n]*)", makefile)
    assert installs
    for line in installs:
        targets = [word for word in line.split() if not word.startswith("-")]
        assert set(targets) <= {"pip", "./plugin", '".[dev]"'}, line
    dev = _project(ROOT / "pyproject.toml")["optional-dependencies"]["dev"]  # type: ignore[index]
    assert any(item.startswith("maturin") for item in dev)
