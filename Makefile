# The two commands a newcomer runs: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q
# uv resolves and installs this set in ~8 s from an empty cache; pip takes over 2 min
# (it backtracks through boto3/aiobotocore releases) and pip < 24 fails outright.
UV     := $(BIN)/uv pip install -q --python $(BIN)/python

.PHONY: demo test lint typecheck conformance bench clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/bin/uv: | $(VENV)/bin/python
	$(PIP) install "uv>=0.5"

$(VENV)/.installed-demo: pyproject.toml | $(VENV)/bin/uv
	$(UV) -e ".[demo]"
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(VENV)/bin/uv
	$(UV) -e ".[test]"
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
