# The two commands a newcomer runs: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: demo test lint typecheck conformance bench clean

# pip older than 24 cannot resolve this set (it backtracks into a conflict): upgrade first.
$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade "pip>=24"

$(VENV)/.installed-demo: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -e ".[demo]"
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -e ".[test]"
	touch $@ $(VENV)/.installed-demo

## demo: set up .venv, run the audit on a generated fleet in a local S3 endpoint
demo: $(VENV)/.installed-demo
	$(BIN)/vakpipe demo

## test: set up .venv with the test extras and run lint, types and the whole suite
test: $(VENV)/.installed-test
	$(BIN)/ruff check pipeline jobs tests bench
	$(BIN)/mypy
	$(BIN)/python -m pytest
	@if [ -x ../shared/conformance/check ]; then ../shared/conformance/check; fi

lint: $(VENV)/.installed-test
	$(BIN)/ruff check pipeline jobs tests bench

typecheck: $(VENV)/.installed-test
	$(BIN)/mypy

conformance: $(VENV)/.installed-test
	../shared/conformance/check

bench: $(VENV)/.installed-test
	$(BIN)/python bench/audit_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
