"""A stand-in `vllm` package on disk, with the classes the adapters check, for fast tests.

`write(root, version, line)` writes a package whose methods have the
parameters of one release line of adapters/targets.py (and whose data classes
have the fields the hooks read); `changes` rewrites single methods or fields
the way a future release might. The real releases are checked against the
same table in tests/vllm/test_signatures.py; this package only exercises how
the plugin chooses, installs and refuses.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from parallelhue_vllm.adapters.targets import FIELDS, TARGETS

# vLLM's logging before 0.31 configures itself at import; from 0.31 only when asked
# (`_configure_vllm_root_logger`), which this stand-in records with a prefix of its own.
LOGGER = """
import logging, sys
PREFIX = "VLLMFAKE "
def _configure_vllm_root_logger(config=None):
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(PREFIX + "%(levelname)s %(message)s"))
    vllm = logging.getLogger("vllm")
    vllm.handlers[:] = [handler]
    vllm.setLevel(logging.INFO)
    vllm.propagate = False
"""


def write(
    root: Path,
    version: str,
    line: str,
    *,
    params: dict[str, tuple[str, ...]] | None = None,
    fields: dict[str, tuple[str, ...]] | None = None,
    configure_logging: bool = True,
    endpoint_plugins: bool = True,
) -> Path:
    """The package under root/vllm; returns root (for sys.path / PYTHONPATH).

    params: "Owner.method" -> the parameters it has instead of the line's.
    fields: "Owner" -> the fields it has instead of those the hooks read.
    """
    params = params or {}
    fields = fields or {}
    classes: dict[str, dict[str, list[str]]] = {}  # module -> class -> body lines
    for target in TARGETS:
        names = params.get(target.name, target.params(line))
        body = classes.setdefault(target.module, {}).setdefault(target.owner, [])
        body.append(f"    def {target.method}({', '.join(names)}):\n        return None\n")
    for entry in FIELDS:
        names = fields.get(entry.owner, entry.names)
        body = classes.setdefault(entry.module, {}).setdefault(entry.owner, [])
        body.append(f"    __struct_fields__ = {tuple(names)!r}\n")
    package = root / "vllm"
    packages = {m for m in classes if any(other.startswith(m + ".") for other in classes)}
    for module, owners in classes.items():
        parts = module.split(".")
        path = root.joinpath(*parts[:-1], parts[-1] + ".py")
        if module in packages:
            path = root.joinpath(*parts, "__init__.py")
        path.parent.mkdir(parents=True, exist_ok=True)
        source = "".join(
            f"class {owner}:\n" + "".join(body) + "\n" for owner, body in owners.items()
        )
        path.write_text(path.read_text() + source if path.exists() else source)
    for directory in [package, *package.rglob("*")]:
        if directory.is_dir() and not (directory / "__init__.py").exists():
            (directory / "__init__.py").write_text("")
    init = package / "__init__.py"
    init.write_text(f"__version__ = {version!r}\n" + init.read_text())
    (package / "logger.py").write_text(LOGGER)
    (package / "envs.py").write_text(f"VLLM_CONFIGURE_LOGGING = {int(configure_logging)}\n")
    if endpoint_plugins:  # vLLM's endpoint plugin interface (telemetry over HTTP)
        endpoints = package / "plugins" / "endpoint_plugins"
        endpoints.mkdir(parents=True)
        (package / "plugins" / "__init__.py").write_text("")
        (endpoints / "__init__.py").write_text("")
    return root


def run(root: Path | None, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter (no PARALLELHUE_VLLM* from here), with the stand-in
    package at `root` first on sys.path."""
    import os

    child_env = {k: v for k, v in os.environ.items() if not k.startswith("PARALLELHUE_VLLM")}
    child_env.update(env)
    if root is not None:
        child_env["PYTHONPATH"] = os.pathsep.join(
            [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=child_env,
        check=False,
        timeout=60,
    )
