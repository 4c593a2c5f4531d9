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

.PHONY: bench test test-rust test-python build lint clean
.DEFAULT_GOAL := test

$(DEPS): Makefile
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch numpy "maturin>=1.5,<2" pytest pytest-timeout hypothesis
	@touch $@

# rloader is installed into the venv as a wheel, the way users get it.
$(WHEEL_STAMP): $(DEPS) $(RUST_SOURCES) $(PY_SOURCES)
	rm -rf dist
	$(VENV)/bin/maturin build --release --interpreter $(PY) -o dist
	$(PY) -m pip install -q --force-reinstall --no-deps dist/rloader-*.whl
	@touch $@

build: $(WHEEL_STAMP)

bench: build
	$(PY) benches/side_by_side.py

test: test-rust test-python

test-rust:
	cargo test --workspace --release

test-python: build
	$(PY) -m pytest -q -p no:cacheprovider

lint:
	cargo fmt --all --check
	cargo clippy --workspace --tests -- -D warnings

clean:
	rm -rf dist target $(VENV)
