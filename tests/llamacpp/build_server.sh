#!/usr/bin/env bash
# Builds llama-server (CPU only) from the llama.cpp vendored in the llama-cpp-python
# sdist, once: the binary is cached outside the tree and reused while it exists.
#   tests/llamacpp/build_server.sh            -> prints the path of llama-server
# The llama.cpp tree it was built from stays beside it (its convert_hf_to_gguf.py
# makes the tests' GGUF: tests/llamacpp/convert_gguf.py):
#   $PARALLELHUE_CACHE/llama-server-VERSION/src/llama_cpp_python-VERSION/vendor/llama.cpp
# Env: LLAMACPP_PY_VERSION (default 0.3.36), PARALLELHUE_CACHE (default ~/.cache/parallelhue),
#      BUILD_JOBS (default: nproc), PYTHON (a python with pip, for `pip download`).
# Needs cmake and a C++ compiler (.ci/apt-packages). Measured from nothing: 2803 s on 2
# cores shared with other builds (load 10-15); about 10 min (562 s) on idle cores.
set -euo pipefail
VERSION=${LLAMACPP_PY_VERSION:-0.3.36}
CACHE=${PARALLELHUE_CACHE:-$HOME/.cache/parallelhue}
DEST=$CACHE/llama-server-$VERSION
BIN=$DEST/bin/llama-server
TREE=$DEST/src/llama_cpp_python-$VERSION/vendor/llama.cpp
built() { [ -x "$BIN" ] && [ -f "$DEST/.complete" ] && [ -f "$TREE/convert_hf_to_gguf.py" ]; }
if built; then
    echo "$BIN"
    exit 0
fi
command -v cmake >/dev/null || { echo "cmake not found: install it (apt-get install cmake)" >&2; exit 2; }
PYTHON=${PYTHON:-python3}
JOBS=${BUILD_JOBS:-$(nproc)}
mkdir -p "$CACHE"
# One build at a time per cache (CI and a developer's test run may race).
exec 9>"$CACHE/.llama-server-$VERSION.lock"
flock 9
if built; then
    echo "$BIN"
    exit 0
fi
WORK=$DEST/src
mkdir -p "$WORK"
SDIST=$WORK/llama_cpp_python-$VERSION.tar.gz
if [ ! -f "$SDIST" ]; then
    # --no-binary for this package only: its build requirements (cmake, scikit-build-core)
    # come as wheels, for pip's metadata step.
    "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps \
        --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$WORK" >&2
fi
if [ ! -f "$TREE/CMakeLists.txt" ]; then
    tar -xzf "$SDIST" -C "$WORK" "llama_cpp_python-$VERSION/vendor/llama.cpp"
fi
# CPU only, no curl, no -march=native (the cached binary must run on any x86_64 CI host).
cmake -S "$TREE" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >&2
start=$(date +%s)
cmake --build "$WORK/build" --target llama-server -j "$JOBS" >&2
echo "llama-server built in $(( $(date +%s) - start )) s with $JOBS jobs" >&2
mkdir -p "$DEST/bin"
cp "$WORK/build/bin/llama-server" "$BIN"
# The object files go; the tree stays (the tests convert their GGUF with its converter).
rm -rf "$WORK/build" "$SDIST"
touch "$DEST/.complete"
echo "$BIN"
