#!/usr/bin/env bash
# `make plugin-pythons`: the vLLM plugin, installed from the wheels `make plugin-dist`
# built (dist/), tested on every CPython it is built for (3.11, 3.12, 3.13 by default).
#
# For each interpreter: a fresh venv outside the tree
# (${PARALLELHUE_CACHE:-~/.cache/parallelhue}/plugin-py3.X, made anew each run), the
# plugin's py3-none-any wheel and that CPython's accelerator wheel installed into it
# (none found: the tests run the Python code and the line says why), then the
# plugin's tests against the installed plugin (the client's pure-Python reference
# decoder and reconciler from python/). One line per interpreter says which
# implementation it ran; the exit code is the first failure's.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
DIST=${DIST:-$REPO/dist}
CACHE=${PARALLELHUE_CACHE:-$HOME/.cache/parallelhue}
TESTS=(test_wire.py test_wire_speedups.py test_plugin_speedups.py test_plugin_hooks.py
       test_plugin_register.py test_adapters.py test_check.py test_traps.py
       test_attribution.py test_emitter.py test_paths.py)

plugin_wheel=$(ls "$DIST"/parallelhue_vllm-*-py3-none-any.whl 2>/dev/null | tail -1 || true)
if [ -z "$plugin_wheel" ]; then
    echo "plugin-pythons: no plugin wheel in $DIST: run make plugin-dist first" >&2
    exit 2
fi
# The interpreters plugin/dist.sh builds for (PLUGIN_PYTHONS overrides both).
read -r -a PYTHONS <<<"${PLUGIN_PYTHONS:-$(bash "$REPO/plugin/dist.sh" --list-pythons)}"
status=0
summary=()
for python in "${PYTHONS[@]}"; do
    version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    tag="cp${version/./}"
    venv="$CACHE/plugin-py$version"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    wheels=("$plugin_wheel")
    speedups=$(ls "$DIST"/parallelhue_vllm_speedups-*-"$tag"-"$tag"-*.whl 2>/dev/null | tail -1 || true)
    [ -n "$speedups" ] && wheels+=("$speedups")
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q "${wheels[@]}" "pytest>=8" "hypothesis>=6.100"
    implementation=$(cd / && "$venv/bin/python" -c \
        'from parallelhue_vllm import accelerator; print(accelerator.load()[1])')
    echo "plugin-pythons: CPython $version: $implementation"
    args=()
    for test in "${TESTS[@]}"; do args+=("tests/$test"); done
    if (cd "$REPO" && PYTHONPATH="$REPO/python" PARALLELHUE_EXPECT_INSTALLED=1 \
            "$venv/bin/python" -m pytest -q -p no:cacheprovider "${args[@]}"); then
        summary+=("CPython $version: passed, $implementation")
    else
        summary+=("CPython $version: FAILED, $implementation")
        [ "$status" -ne 0 ] || status=1
    fi
done
printf 'plugin-pythons: %s\n' "${summary[@]}"
exit "$status"
