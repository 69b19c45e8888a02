"""Build parallelhue_vllm._speedups in place, for a source checkout (tests, benches, `make native`).

`pip install ./plugin` builds it through setup.py instead. Without a C compiler
this exits 1 with one line and the plugin keeps running its pure-Python code.

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
SOURCE = PACKAGE / "_speedups.c"


def target() -> Path:
    return PACKAGE / ("_speedups" + str(sysconfig.get_config_var("EXT_SUFFIX") or ".so"))


def build() -> Path:
    """Compile the extension next to its source if it is missing or older; returns its path."""
    out = target()
    if out.exists() and out.stat().st_mtime >= SOURCE.stat().st_mtime:
        return out
    compiler = shlex.split(os.environ.get("CC") or str(sysconfig.get_config_var("CC") or "cc"))
    command = [
        *compiler, "-O2", "-Wall", "-shared", "-fPIC",
        f"-I{sysconfig.get_paths()['include']}", str(SOURCE), "-o", str(out) + ".tmp",
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, text=True)
    os.replace(str(out) + ".tmp", out)
    return out


if __name__ == "__main__":
    try:
        print(build())
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or str(error)
        print(f"parallelhue_vllm._speedups not built (pure Python is used): {detail.strip()}")
        sys.exit(1)
