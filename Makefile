# The two commands a newcomer runs: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q
# uv resolves and installs this set in ~8 s from an empty cache; pip takes over 2 min
# (it backtracks through boto3/aiobotocore releases) and pip < 24 fails outright.
# --compile-bytecode: uv, unlike pip, leaves the .pyc files to the first import, which
# never writes them where PYTHONDONTWRITEBYTECODE is set (as on these machines), so every
# process (each command, each Dask worker) compiled what it imported: `vakpipe audit` +
# `vakpipe cost` of 2 GB of transcripts took 7.9 s, 6.4 s with them
# (docs/ccusage-comparison.md, round 5). The project's own modules (installed
# editable) get theirs from compileall.
UV     := $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python
COMPILE := $(BIN)/python -m compileall -q pipeline jobs
# checkov pins boto3 1.35 (this project needs 1.43): it gets a virtualenv of its own,
# found there by tests/deploy. Pinned so a new release cannot change the verdict.
CHECKOV_VERSION := 3.3.30
CHECKOV := $(VENV)/checkov/bin/checkov

.PHONY: demo test test-lowest lint typecheck conformance bench sanitize deploy-check lock clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/bin/uv: | $(VENV)/bin/python
	$(PIP) install "uv>=0.5"

# The runtime dependencies are installed at the versions of the image's lock, so the
# tests run what the image ships (`make lock` re-pins after a change to pyproject.toml).
LOCK   := deploy/image/requirements.lock
# The per-line kernel's C source: a change rebuilds the extension in place (setup.py).
KERNEL := pipeline/ledger/_ckernel.c

$(VENV)/.installed-demo: pyproject.toml setup.py $(KERNEL) $(LOCK) | $(VENV)/bin/uv
	$(UV) -e ".[demo]" -c $(LOCK)
	$(COMPILE)
	touch $@

$(VENV)/.installed-test: pyproject.toml setup.py $(KERNEL) $(LOCK) | $(VENV)/bin/uv
	$(UV) -e ".[test,deploy-check]" -c $(LOCK)
	$(COMPILE)
	touch $@ $(VENV)/.installed-demo

$(CHECKOV): Makefile | $(VENV)/bin/uv
	$(BIN)/uv venv -q --allow-existing --python $(BIN)/python $(VENV)/checkov
	$(BIN)/uv pip install -q --python $(VENV)/checkov/bin/python "checkov==$(CHECKOV_VERSION)"
	touch $@

## demo: set up .venv, run the audit on a generated fleet in a local S3 endpoint
demo: $(VENV)/.installed-demo
	$(BIN)/vakpipe demo

## test: set up .venv with the test extras and run lint, types and the whole suite
test: $(VENV)/.installed-test $(CHECKOV)
	$(BIN)/ruff check pipeline jobs tests bench infra
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest
	@if [ -x ../shared/conformance/check ]; then ../shared/conformance/check; fi

## test-lowest: the whole suite on the oldest releases pyproject.toml admits (uv's
# lowest-direct resolution of the runtime and test dependencies, in .venv/lowest; needs
# the package registry). Minutes, so not in `make test`, where
# tests/project/test_lower_bounds.py runs every stage's command on each runtime
# dependency's exact lower bound.
LOWEST := $(VENV)/lowest
test-lowest: $(CHECKOV) | $(VENV)/bin/uv
	$(BIN)/uv venv -q --allow-existing --python $(BIN)/python $(LOWEST)
	$(BIN)/uv pip install -q --compile-bytecode --python $(LOWEST)/bin/python \
	  --resolution lowest-direct -e ".[test,deploy-check]"
	$(COMPILE)
	VAKPIPE_CHECKOV=$(CURDIR)/$(CHECKOV) $(LOWEST)/bin/python -m pytest \
	  $(foreach t,$(NOT_LOWEST),--deselect "$(t)")

# What `make test-lowest` leaves out, by design: the check that the tests run the lock's
# releases, and the benches that run the project at an older git revision beside this
# one (that revision's code needs the newer releases of its day: click 8.4). The floors
# test skips itself there (no uv in .venv/lowest): it is `make test`'s. checkov keeps its
# own pinned virtualenv, named to the deploy checks by VAKPIPE_CHECKOV.
NOT_LOWEST := tests/deploy/test_deploy_image.py::test_the_tests_run_the_versions_the_image_ships \
  tests/project/test_bench_quick.py::test_quick_run_prints_its_figures[nightly_first_night] \
  tests/project/test_bench_quick.py::test_quick_run_prints_its_figures[object_store_latency]

lint: $(VENV)/.installed-test
	$(BIN)/ruff check pipeline jobs tests bench infra
	$(BIN)/lint-imports

typecheck: $(VENV)/.installed-test
	$(BIN)/mypy

conformance: $(VENV)/.installed-test
	../shared/conformance/check

bench: $(VENV)/.installed-test
	$(BIN)/python bench/audit_throughput.py

## sanitize: the C kernel built under AddressSanitizer and UndefinedBehaviorSanitizer,
# its tests and SANITIZE_SECONDS of mutated archives (docs/audit.md, "Memory safety").
# Not in `make test`: it takes minutes, and needs gcc's sanitizer runtimes.
SANITIZE_SECONDS ?= 300
sanitize: $(VENV)/.installed-test
	tests/sanitize.sh $(SANITIZE_SECONDS)

## deploy-check: only the offline checks of deploy/ and infra/ (part of `make test`)
deploy-check: $(VENV)/.installed-test $(CHECKOV)
	$(BIN)/python -m pytest tests/deploy

## lock: re-pin the runtime image's dependencies from pyproject.toml (needs PyPI)
lock: | $(VENV)/bin/uv
	$(BIN)/uv pip compile -q pyproject.toml --universal --python-version 3.11 \
	  --generate-hashes -o $(LOCK)
	printf 'setuptools>=68\nwheel\n' | $(BIN)/uv pip compile -q - --universal \
	  --python-version 3.11 --generate-hashes -o deploy/image/build-requirements.lock

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
