#!/usr/bin/env bash
# `make plugin-dist`: the vLLM plugin's wheels, into dist/ (or $DIST).
#
#   parallelhue_vllm-<v>-py3-none-any.whl             the plugin: pure Python, any CPython >= 3.10
#   parallelhue_vllm_speedups-<v>-cp3XX-...whl        its optional C accelerator, one per CPython
#
# A server installs the first, and the second when there is one for its Python
# (pip picks it by the tag); without it the plugin runs its Python code and
# says so. Accelerator wheels are built for every CPython in $PLUGIN_PYTHONS
# (interpreter paths), by default 3.11, 3.12 and 3.13 found under pyenv or on
# PATH; one that cannot be built is reported in one line and the others go on.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
DIST=${DIST:-$REPO/dist}
PYTHON=${PYTHON:-python3}

find_pythons() {
    local version found
    for version in 3.11 3.12 3.13; do
        found=""
        if command -v pyenv >/dev/null; then
            found=$(ls -d "$(pyenv root)"/versions/"$version".*/bin/python 2>/dev/null | sort -V | tail -1 || true)
        fi
        [ -n "$found" ] || found=$(command -v "python$version" || true)
        if [ -n "$found" ]; then
            echo "$found"
        else
            echo "plugin-dist: no CPython $version found (pyenv or python$version on PATH): no accelerator wheel for it" >&2
        fi
    done
}

clean_build_trees() {
    rm -rf "$REPO/plugin/build" "$REPO"/plugin/*.egg-info "$REPO/plugin/speedups/build" \
        "$REPO"/plugin/speedups/*.egg-info
}

if [ "${1:-}" = "--list-pythons" ]; then
    find_pythons | tr '\n' ' '
    exit 0
fi
mkdir -p "$DIST"
rm -f "$DIST"/parallelhue_vllm-*.whl "$DIST"/parallelhue_vllm_speedups-*.whl
trap clean_build_trees EXIT
"$PYTHON" -m pip wheel -q --no-deps -w "$DIST" "$REPO/plugin"
read -r -a PYTHONS <<<"${PLUGIN_PYTHONS:-$(find_pythons | tr '\n' ' ')}"
for python in "${PYTHONS[@]}"; do
    version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if ! log=$("$python" -m pip wheel -q --no-deps -w "$DIST" "$REPO/plugin/speedups" 2>&1); then
        echo "plugin-dist: no accelerator wheel for CPython $version (the plugin runs pure Python there): $(echo "$log" | grep -m1 -i error || echo "$log" | tail -1)" >&2
    fi
    clean_build_trees
done
ls -1 "$DIST"/parallelhue_vllm*.whl
