# The two commands at the top of the README's Develop section:
#   make bench   set everything up, then run rloader vs torch.utils.data side by side
#                (and the real pipelines' short version)
#   make test    set everything up, then run every test (Rust and Python)
# Everything lives in a git-ignored .venv, created on first use and reused after.
#   make test-oldest   the Python tests on the oldest Python and torch claimed (.venv-oldest)
#   make soak, make fuzz   the long soak and the fuzzers (docs/develop.md)
#   make bench-real   the real pipelines (JPEG folders, tar shards, token windows, Arrow) in full,
#                     then fresh workers under real scripts' heaps

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
# The interpreter .venv is made from (CI names the newest Python: `make test PYTHON=python3.13`).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEPS := $(VENV)/.deps-installed
WHEEL_STAMP := $(VENV)/.rloader-installed
RUST_SOURCES := $(shell find rust -name '*.rs' -o -name Cargo.toml) Cargo.toml
PY_SOURCES := $(shell find python -name '*.py' -o -name '*.pyi' -o -name py.typed) pyproject.toml

.PHONY: bench bench-real bench-resume test test-rust test-python test-oldest build lint fuzz soak clean FORCE
.DEFAULT_GOAL := test

# What every venv gets to run the tests. lightning, accelerate and transformers:
# tests/test_lightning.py, test_accelerate.py and test_transformers.py check what those
# frameworks do with rloader's loaders (pip picks the transformers release that suits the
# venv's Python: 4.57 on 3.9). pytest-xdist and pytest-randomly as in pyproject's `test` extra
# (randomly shuffles the tests' order: one that leans on another's leftovers fails).
TEST_TOOLS := numpy pytest pytest-timeout pytest-xdist pytest-randomly hypothesis lightning accelerate transformers
# torchdata's StatefulDataLoader is the reference tests/test_resume.py compares resuming with
# (those tests skip without it). 0.11.0 is its last release, made for torch 2.6 and working
# with the newer ones; installed without its dependencies (requests and urllib3, which no module
# of torchdata 0.11 imports; and torch): the venv's torch stays the one chosen.
TORCHDATA := torchdata==0.11.0

# Which Python an interpreter is ("prefix version"); a venv's answers for the Python it was made
# from. NEW_VENV: $(call NEW_VENV,venv,python) makes the venv from that python, first removing
# one made from another Python.
PY_ID_CODE := import sys; print(sys.base_prefix, sys.version.split()[0])
PY_ID = $(if $(1),$(shell $(1) -c '$(PY_ID_CODE)' 2>/dev/null))
define NEW_VENV
	@command -v $(2) >/dev/null || { echo "error: no Python '$(2)' to make $(1) from"; exit 1; }
	@if [ -x $(1)/bin/python ] && [ "$$($(1)/bin/python -c '$(PY_ID_CODE)')" != "$$($(2) -c '$(PY_ID_CODE)')" ]; then \
		echo "== $(1) was made from another Python than $(2): making it again"; rm -rf $(1); fi
	@test -x $(1)/bin/python || { echo "== creating $(1) with $(2) ($$($(2) --version))"; $(2) -m venv $(1); }
endef

# A venv made from another interpreter than the one asked for (an old .venv from python3 when
# CI asks for python3.13) is made again: its deps stamp is then out of date whatever its time.
ifneq ($(call PY_ID,$(PY)),$(call PY_ID,$(PYTHON)))
$(DEPS): FORCE
endif

# rloader.vision's tests compare with torchvision and Pillow (the `vision` extra). torchvision
# must match the venv's torch, and pip would otherwise replace torch to suit a newer
# torchvision: a constraint holds torch at the installed distribution's version
# (importlib.metadata's, which pip compares; torch.__version__ may carry a "+cu..." label).
# $(call PINNED_INSTALL,python,packages): pip install with the venv's torch held.
define PINNED_INSTALL
	$(1) -c 'import importlib.metadata as m; print("torch==" + m.version("torch"))' > $(dir $(1))../torch-constraint.txt
	$(1) -m pip install -q --no-cache-dir -c $(dir $(1))../torch-constraint.txt $(2)
endef
VISION_TOOLS = $(call PINNED_INSTALL,$(1),torchvision pillow)

# The wheel's JPEG decoder is libjpeg-turbo, built from the turbojpeg-sys crate's vendored source
# with cmake and nasm (its SIMD). Debian's packages; installed here when missing (as root).
NATIVE_TOOLS := cmake nasm
define NEED_NATIVE_TOOLS
	@for t in $(NATIVE_TOOLS); do command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	if [ -n "$${missing:-}" ]; then \
		echo "== installing$$missing (Debian's packages) to build libjpeg-turbo"; \
		if [ "$$(id -u)" = 0 ]; then apt-get install -y -q$$missing >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q$$missing >/dev/null; }; \
		else echo "error: building rloader needs$$missing: sudo apt-get install$$missing"; exit 1; fi; fi
endef

# --no-cache-dir: torch and its CUDA libraries are ~3 GB of downloads; a pip cache would hold a
# second copy of them beside the installed ~5 GB, and CI machines can be short of disk.
$(DEPS): Makefile
	$(call NEW_VENV,$(VENV),$(PYTHON))
	@echo "== installing torch, maturin and the test tools into $(VENV)"
	@echo "   (the first time: ~3 GB of downloads for torch, a few minutes, quiet until done)"
	$(PY) -m pip install -q --no-cache-dir --upgrade pip
	$(PY) -m pip install -q --no-cache-dir torch "maturin>=1.5,<2" $(TEST_TOOLS)
	$(PY) -m pip install -q --no-cache-dir --no-deps "$(TORCHDATA)"
	$(call VISION_TOOLS,$(PY))
	@touch $@

# rloader is installed into the venv as a wheel, the way users get it.
$(WHEEL_STAMP): $(DEPS) $(RUST_SOURCES) $(PY_SOURCES)
	@echo "== building rloader's wheel (release build of the Rust core) and installing it into $(VENV)"
	$(NEED_NATIVE_TOOLS)
	rm -rf dist
	$(VENV)/bin/maturin build --release --interpreter $(PY) -o dist
	$(PY) -m pip install -q --force-reinstall --no-deps dist/rloader-*.whl
	@touch $@

build: $(WHEEL_STAMP)

# What benches/real_pipelines.py builds its pipelines from, beyond the test tools: torchvision
# (ImageFolder, the transforms), pillow, webdataset and datasets, with the venv's torch held.
BENCH_TOOLS := torchvision pillow webdataset datasets
BENCH_STAMP := $(VENV)/.bench-tools-installed

$(BENCH_STAMP): $(DEPS)
	@echo "== installing the real pipelines' libraries into $(VENV): $(BENCH_TOOLS)"
	$(call PINNED_INSTALL,$(PY),$(BENCH_TOOLS))
	@touch $@

# side_by_side.py, then the real pipelines' short version (--quick: a few hundred samples each,
# about a minute; their data is generated into .bench-data/ at the first run), a smoke run whose
# rows are shown but not scored; then one table of both. Each run is a dated JSON file in
# benches/results/ (the smoke run's in benches/results/smoke/, git-ignored).
bench: build $(BENCH_STAMP)
	$(PY) benches/side_by_side.py
	$(PY) benches/real_pipelines.py --quick
	$(PY) benches/bench_results.py --latest side_by_side real_pipelines

# The real pipelines in full (benches/real_pipelines.py; docs/benchmarks.md): the first run
# generates ~110 MB of JPEGs, tar shards of them, a 200 MB token file and an Arrow table. Then
# fresh workers under real scripts' heaps (benches/fresh_workers.py, issue #36: each run a
# script of its own, several minutes; it adds a 40 MB annotations file to the data). Then
# num_workers="auto" beside 1 and 2 busy processes (issue #36), GIL-holding and I/O-like
# loading, against torch and the fixed settings under the same load (a few minutes each).
bench-real: build $(BENCH_STAMP)
	$(PY) benches/real_pipelines.py
	$(PY) benches/fresh_workers.py
	for busy in 1 2; do $(PY) benches/auto_workers.py --only pure-python,sleep \
		--settings 0p,2p,4p,2t,8t,32t --epochs 4 --busy $$busy; done

# Resuming 90% into a 50M-sample epoch, against torchdata's StatefulDataLoader (installed here
# without its dependencies, which the venv already has: torchdata is only this bench's baseline).
bench-resume: build
	$(PY) -m pip install -q --no-cache-dir --no-deps "torchdata==0.11.0"
	$(PY) benches/resume.py

test: test-rust test-python

test-rust:
	$(NEED_NATIVE_TOOLS)
	@echo "== Rust tests (cargo test --workspace --release)"
	cargo test --workspace --release

# The Python tests run as the suite must hold up: 4 at a time (pytest-xdist) on however many
# cores, in an order pytest-randomly shuffles (the seed is printed first; PYTEST_ARGS="-n 4
# -p randomly --randomly-seed=N" replays an order; PYTEST_ARGS="-p no:randomly" runs them one
# at a time in file order).
PYTEST_ARGS ?= -n 4
test-python: build
	@echo "== Python tests (pytest $(PYTEST_ARGS); several minutes: many tests start worker processes)"
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# The long soak (tests/soak.py; tests/test_soak.py runs a short one): 10,000 iterators with
# faults drawn at random, then 1,000 more under CPython's debug allocator, which catches writes
# past a block and use after free. Each case must end within bounds and leave nothing behind.
# The memory held (resident memory less malloc's free bytes, which fragment over a long run)
# climbs for the first ~2,000 iterators (the allocators' arenas and caches filling: no Python
# object count grows) and is sampled from there (--warmup, in cases); a leak is judged by the
# samples' steady slope, so a one-time step to a plateau after the warm-up is not one.
soak: build
	$(PY) -X faulthandler tests/soak.py --iterators 10000 --seed 1 --warmup 1500
	PYTHONMALLOC=debug $(PY) -X faulthandler tests/soak.py --iterators 1000 --seed 2 --warmup 300

# The same Python tests on the oldest Python and the oldest torch pyproject.toml claims, in a
# venv of their own (another ~5 GB), with a wheel built for that Python (rloader's wheels are
# per Python version, not abi3). OLDEST_PYTHON: pyenv's 3.9, else python3.9 on PATH.
OLDEST_PYTHON_VERSION := 3.9
OLDEST_TORCH := 2.6.0
OLDEST_PYTHON ?= $(firstword $(wildcard $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions/$(OLDEST_PYTHON_VERSION).*/bin/python$(OLDEST_PYTHON_VERSION)) \
	$(shell command -v python$(OLDEST_PYTHON_VERSION)))
OLDEST_VENV := .venv-oldest
OLDEST_PY := $(OLDEST_VENV)/bin/python
OLDEST_DEPS := $(OLDEST_VENV)/.deps-installed
OLDEST_WHEEL_STAMP := $(OLDEST_VENV)/.rloader-installed
OLDEST_DIST := dist-oldest

ifneq ($(call PY_ID,$(OLDEST_PY)),$(call PY_ID,$(OLDEST_PYTHON)))
$(OLDEST_DEPS): FORCE
endif

$(OLDEST_DEPS): Makefile
	@test -n "$(OLDEST_PYTHON)" || { echo "error: make test-oldest needs Python $(OLDEST_PYTHON_VERSION), the oldest"\
		"pyproject.toml claims, and found none (neither pyenv's nor python$(OLDEST_PYTHON_VERSION) on PATH)."\
		"Install one (pyenv install $(OLDEST_PYTHON_VERSION), or your system's python$(OLDEST_PYTHON_VERSION) and"\
		"python$(OLDEST_PYTHON_VERSION)-venv packages), or name it: make test-oldest OLDEST_PYTHON=/path/to/python$(OLDEST_PYTHON_VERSION)"; exit 1; }
	$(call NEW_VENV,$(OLDEST_VENV),$(OLDEST_PYTHON))
	@echo "== installing torch $(OLDEST_TORCH) and the test tools into $(OLDEST_VENV)"
	$(OLDEST_PY) -m pip install -q --no-cache-dir --upgrade pip
	$(OLDEST_PY) -m pip install -q --no-cache-dir "torch==$(OLDEST_TORCH)" "maturin>=1.5,<2" $(TEST_TOOLS)
	$(OLDEST_PY) -m pip install -q --no-cache-dir --no-deps "$(TORCHDATA)"
	$(call VISION_TOOLS,$(OLDEST_PY))
	@touch $@

$(OLDEST_WHEEL_STAMP): $(OLDEST_DEPS) $(RUST_SOURCES) $(PY_SOURCES)
	@echo "== building rloader's wheel for $(OLDEST_PY) ($$($(OLDEST_PY) --version)) and installing it there"
	$(NEED_NATIVE_TOOLS)
	rm -rf $(OLDEST_DIST)
	$(OLDEST_VENV)/bin/maturin build --release --interpreter $(OLDEST_PY) -o $(OLDEST_DIST)
	$(OLDEST_PY) -m pip install -q --force-reinstall --no-deps $(OLDEST_DIST)/rloader-*.whl
	@touch $@

test-oldest: $(OLDEST_WHEEL_STAMP)
	@echo "== Python tests on Python $(OLDEST_PYTHON_VERSION) with torch $(OLDEST_TORCH)"
	$(OLDEST_PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# Fuzzing what the worker pool decodes from another process: its messages, region layout and
# slots (rust/rloader-workers/tests/fuzz.rs) and the rings' framing and positions
# (rust/rloader-queue/tests/fuzz.rs), FUZZ_INPUTS inputs each, from a fresh seed each run (the
# output says it; RLOADER_FUZZ_SEED=<seed> replays a run). A short fixed-seed round of both is
# part of `make test-rust`. Then FUZZ_IMAGES mutated JPEG and PNG files through rloader.vision's
# decoding (rust/rloader-vision/tests/fuzz.rs; a short round is in `make test-rust` too). Then
# 100,000 malformed, truncated and hostile states through
# DataLoader.load_state_dict (tests/fuzz_state.py; tests/test_state_fuzz.py runs 3,000).
FUZZ_INPUTS ?= 10000000
FUZZ_STATES ?= 100000
FUZZ_IMAGES ?= 1000000
fuzz: build
	@echo "== fuzzing the pool's decoders, $(FUZZ_INPUTS) inputs each (a few minutes)"
	RLOADER_FUZZ_INPUTS=$(FUZZ_INPUTS) cargo test --release -p rloader-workers -p rloader-queue \
		--test fuzz -- --ignored --nocapture
	@echo "== fuzzing rloader.vision's decoding with $(FUZZ_IMAGES) mutated JPEG and PNG files"
	RLOADER_FUZZ_INPUTS=$(FUZZ_IMAGES) cargo test --release -p rloader-vision --test fuzz \
		-- --ignored --nocapture
	@echo "== fuzzing load_state_dict with $(FUZZ_STATES) malformed states"
	$(PY) -W ignore tests/fuzz_state.py --states $(FUZZ_STATES) --seed 1

# ruff checks the Python; import-linter (lint-imports) the package's layers, read from the source
# tree (pyproject.toml's contracts: imports run downward, so no cycle comes back); mypy's stubtest
# checks the installed wheel's _rloader.pyi (a copy of
# python/rloader/_rloader.pyi, hence `build`) against its native module. It reads the installed
# copy on purpose: with python/ on mypy's path it would type-check the whole package first.
# `clippy --tests` skips the extension (its tests are Python's: `test = false`), hence the
# second clippy.
lint: build
	@echo "== linters: rustfmt, clippy, ruff (check and format), import layers, mypy stubtest"
	cargo fmt --all --check
	cargo clippy --workspace --tests -- -D warnings
	cargo clippy -p rloader-py -- -D warnings
	$(PY) -m pip install -q --no-cache-dir "ruff>=0.17,<0.18" "mypy>=2.4,<3" "import-linter>=2.1,<3"
	$(VENV)/bin/ruff check python tests benches
	$(VENV)/bin/ruff format --check python tests benches
	PYTHONPATH=python $(VENV)/bin/lint-imports
	$(PY) -m mypy.stubtest rloader._rloader

clean:
	rm -rf dist $(OLDEST_DIST) target $(VENV) $(OLDEST_VENV)
