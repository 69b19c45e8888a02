#!/usr/bin/env bash
# Arctic Inference's suffix trees, for vLLM's `suffix` method (test_spec_methods.py),
# into a vLLM venv that setup_venv.sh built:
#
#   bash tests/vllm/install_arctic.sh VENV_DIR
#
# Idempotent. PyPI has only its sdist; its build imports torch, so it builds against
# the venv's torch (--no-build-isolation), with its other build requirements in a
# scratch directory rather than in the venv (grpcio-tools would upgrade its protobuf).
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: bash tests/vllm/install_arctic.sh VENV_DIR" >&2
    exit 2
fi
PY=$1/bin/python
ARCTIC_INFERENCE=arctic-inference==0.3.0
if "$PY" -c "import arctic_inference.suffix_decoding" >/dev/null 2>&1; then
    exit 0
fi
echo "install_arctic: building $ARCTIC_INFERENCE into $1 (about a minute)"
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
"$PY" -m pip install -q --target "$SCRATCH/deps" "nanobind==2.9.2" cmake ninja grpcio-tools wheel
PYTHONPATH=$SCRATCH/deps PATH=$SCRATCH/deps/bin:$PATH "$PY" -m pip wheel -q --no-deps \
    --no-build-isolation -w "$SCRATCH/wheel" "$ARCTIC_INFERENCE"
"$PY" -m pip install -q --no-deps "$SCRATCH"/wheel/arctic_inference-*.whl
"$PY" -c "import arctic_inference.suffix_decoding" || {
    echo "install_arctic: $ARCTIC_INFERENCE does not import in $1; see the pip output above" >&2
    exit 1
}
