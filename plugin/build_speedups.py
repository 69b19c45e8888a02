"""Build parallelhue_vllm._speedups in place, for a source checkout (tests, benches).

Servers install it as its own wheel per CPython (plugin/speedups, built by
`make plugin-dist`). Without a C compiler this exits 1 with one line and the
plugin keeps running its pure-Python code.

    python plugin/build_speedups.py
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent / "parallelhue_vllm"
SOURCES = Path(__file__).resolve().parent / "speedups" / "src"
# The flags the speedups distribution builds with (plugin/speedups/setup.py).
CFLAGS = ["-O2", "-Wall", "-fvisibility=hidden"]


def target() -> Path:
    return PACKAGE / ("_speedups" + str(sysconfig.get_config_var("EXT_SUFFIX") or ".so"))


def sources(directory: Path = SOURCES) -> list[Path]:
    return sorted(directory.glob("*.c"))


def build() -> Path:
    """Compile the extension next to the package if it is missing or older than a source."""
    out = target()
    newest = max(path.stat().st_mtime for path in [*sources(), *SOURCES.glob("*.h")])
    if out.exists() and out.stat().st_mtime >= newest:
        return out
    compile_to(out, SOURCES)
    return out


def compile_to(out: Path, directory: Path, flags: list[str] | None = None) -> None:
    """One compiler call for every source of `directory` (raises CalledProcessError)."""
    compiler = shlex.split(os.environ.get("CC") or str(sysconfig.get_config_var("CC") or "cc"))
    command = [
        *compiler, *(CFLAGS if flags is None else flags), "-shared", "-fPIC",
        f"-I{sysconfig.get_paths()['include']}", *map(str, sources(directory)),
        "-o", str(out) + ".tmp",
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, text=True)
    os.replace(str(out) + ".tmp", out)


if __name__ == "__main__":
    try:
        print(build())
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or str(error)
        print(f"parallelhue_vllm._speedups not built (pure Python is used): {detail.strip()}")
        sys.exit(1)
