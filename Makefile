# The two commands the README opens with:
#   make bench   set everything up, then run rloader vs torch.utils.data side by side
#   make test    set everything up, then run every test (Rust and Python)
# Everything lives in a git-ignored .venv, created on first use and reused after.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := .venv
PY := $(VENV)/bin/python
DEPS := $(VENV)/.deps-installed
WHEEL_STAMP := $(VENV)/.rloader-installed
RUST_SOURCES := $(shell find rust -name '*.rs' -o -name Cargo.toml) Cargo.toml
PY_SOURCES := $(shell find python -name '*.py' -o -name '*.pyi' -o -name py.typed) pyproject.toml

.PHONY: bench bench-resume test test-rust test-python test-oldest-torch build lint fuzz soak clean
.DEFAULT_GOAL := test

# lightning and accelerate: tests/test_lightning.py and tests/test_accelerate.py check what those
# frameworks do with rloader's loaders.
# --no-cache-dir: torch and its CUDA libraries are ~3 GB of downloads; a pip cache would hold a
# second copy of them beside the installed ~5 GB, and CI machines can be short of disk.
$(DEPS): Makefile
	@test -x $(PY) || { echo "== creating $(VENV)"; python3 -m venv $(VENV); }
	@echo "== installing torch, numpy, maturin and the test tools into $(VENV)"
	@echo "   (the first time: ~3 GB of downloads for torch, a few minutes, quiet until done)"
	$(PY) -m pip install -q --no-cache-dir --upgrade pip
	$(PY) -m pip install -q --no-cache-dir torch numpy "maturin>=1.5,<2" pytest pytest-timeout hypothesis \
		lightning accelerate
	@touch $@

# rloader is installed into the venv as a wheel, the way users get it.
$(WHEEL_STAMP): $(DEPS) $(RUST_SOURCES) $(PY_SOURCES)
	@echo "== building rloader's wheel (release build of the Rust core) and installing it into $(VENV)"
	rm -rf dist
	$(VENV)/bin/maturin build --release --interpreter $(PY) -o dist
	$(PY) -m pip install -q --force-reinstall --no-deps dist/rloader-*.whl
	@touch $@

build: $(WHEEL_STAMP)

bench: build
	$(PY) benches/side_by_side.py

# Resuming 90% into a 50M-sample epoch, against torchdata's StatefulDataLoader (installed here
# without its dependencies, which the venv already has: torchdata is only this bench's baseline).
bench-resume: build
	$(PY) -m pip install -q --no-cache-dir --no-deps "torchdata==0.11.0"
	$(PY) benches/resume.py

test: test-rust test-python

test-rust:
	@echo "== Rust tests (cargo test --workspace --release)"
	cargo test --workspace --release

test-python: build
	@echo "== Python tests (pytest; several minutes: many tests start worker processes)"
	$(PY) -m pytest -q -p no:cacheprovider

# The long soak (tests/soak.py; tests/test_soak.py runs a short one): 10,000 iterators with
# faults drawn at random, then 1,000 more under CPython's debug allocator, which catches writes
# past a block and use after free. Each case must end within bounds and leave nothing behind.
soak: build
	$(PY) -X faulthandler tests/soak.py --iterators 10000 --seed 1
	PYTHONMALLOC=debug $(PY) -X faulthandler tests/soak.py --iterators 1000 --seed 2

# The same Python tests against the oldest torch pyproject.toml claims, in a venv of its own
# (another ~5 GB; not part of `make test`, run before a release).
OLDEST_TORCH := 2.6.0
OLDEST_VENV := .venv-torch$(OLDEST_TORCH)
test-oldest-torch: build
	@test -x $(OLDEST_VENV)/bin/python || { echo "== creating $(OLDEST_VENV)"; python3 -m venv $(OLDEST_VENV); }
	@echo "== installing torch $(OLDEST_TORCH) and the test tools into $(OLDEST_VENV)"
	$(OLDEST_VENV)/bin/python -m pip install -q --no-cache-dir "torch==$(OLDEST_TORCH)" numpy \
		pytest pytest-timeout hypothesis lightning accelerate
	$(OLDEST_VENV)/bin/python -m pip install -q --force-reinstall --no-deps dist/rloader-*.whl
	$(OLDEST_VENV)/bin/python -m pytest -q -p no:cacheprovider

# Fuzzing what the worker pool decodes from another process: its messages, region layout and
# slots (rust/rloader-workers/tests/fuzz.rs) and the rings' framing and positions
# (rust/rloader-queue/tests/fuzz.rs), FUZZ_INPUTS inputs each, from a fresh seed each run (the
# output says it; RLOADER_FUZZ_SEED=<seed> replays a run). A short fixed-seed round of both is
# part of `make test-rust`. Then 100,000 malformed, truncated and hostile states through
# DataLoader.load_state_dict (tests/fuzz_state.py; tests/test_state_fuzz.py runs 3,000).
FUZZ_INPUTS ?= 10000000
FUZZ_STATES ?= 100000
fuzz: build
	@echo "== fuzzing the pool's decoders, $(FUZZ_INPUTS) inputs each (a few minutes)"
	RLOADER_FUZZ_INPUTS=$(FUZZ_INPUTS) cargo test --release -p rloader-workers -p rloader-queue \
		--test fuzz -- --ignored --nocapture
	@echo "== fuzzing load_state_dict with $(FUZZ_STATES) malformed states"
	$(PY) -W ignore tests/fuzz_state.py --states $(FUZZ_STATES) --seed 1

# ruff checks the Python; mypy's stubtest checks the installed wheel's _rloader.pyi (a copy of
# python/rloader/_rloader.pyi, hence `build`) against its native module. It reads the installed
# copy on purpose: with python/ on mypy's path it would type-check the whole package first.
# `clippy --tests` skips the extension (its tests are Python's: `test = false`), hence the
# second clippy.
lint: build
	@echo "== linters: rustfmt, clippy, ruff (check and format), mypy stubtest"
	cargo fmt --all --check
	cargo clippy --workspace --tests -- -D warnings
	cargo clippy -p rloader-py -- -D warnings
	$(PY) -m pip install -q --no-cache-dir "ruff>=0.17,<0.18" "mypy>=2.4,<3"
	$(VENV)/bin/ruff check python tests benches
	$(VENV)/bin/ruff format --check python tests benches
	$(PY) -m mypy.stubtest rloader._rloader

clean:
	rm -rf dist target $(VENV)
