# dlreplay: two commands on a fresh machine, `make demo` and `make test`.
# Both create .venv if missing and install the package (editable) with the extras they need;
# the install is skipped while pyproject.toml, setup.py and the C scanner are unchanged, so second
# runs are fast (a changed C extension, analyze/trace/_pfwscan.c or analyze/_kernels.c, re-runs the
# editable install, which rebuilds it).

VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.dlreplay-installed
EXTRAS  ?= torch,mpi,parquet,streaming,s3,dev

# The source tree's bytecode, written even where PYTHONDONTWRITEBYTECODE is set (CI images often
# set it): without it every dlreplay process a test or the demo starts compiles the package anew,
# about 0.1 s each (the CLI-heavy bad-options and bad-models tests: 13.5 s -> 11.4 s).
PYC     = $(PY) -m compileall -q -j 0 dlreplay analyze capture replay examples tests benchmarks > /dev/null || true

.DEFAULT_GOAL := help
.PHONY: help venv demo test test-fast lint bench clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml setup.py analyze/trace/_pfwscan.c analyze/_kernels.c analyze/_pybuf.h | $(PY)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned to 2.13.0 (the local CPU build) in the `torch` extra; pip never resolves a newer one.
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	@touch $(STAMP)

venv: $(STAMP)  ## create .venv and install dlreplay with all extras

demo: $(STAMP)  ## run the whole pipeline on the bundled example job (outputs in demo-out/)
	@$(PYC)
	$(VENV)/bin/dlreplay demo --out demo-out

# Test processes (pytest-xdist), each test file whole in one of them (its module fixtures, the
# real captures many tests share, run once). 2 by default: the CI machine's cores; most tests
# wait on real jobs and subprocesses, so two overlap well even on 2 cores. TEST_JOBS=0 runs
# in this process alone.
TEST_JOBS ?= 2

test: $(STAMP)  ## run the test suite (unit + end-to-end on real captures; TEST_JOBS=2 processes)
	@$(PYC)
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_JOBS) --dist loadfile

test-fast: $(STAMP)  ## unit tests only (skips the slow end-to-end captures)
	@$(PYC)
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow"

LINTED  = dlreplay capture analyze replay tests benchmarks examples traces

lint: $(STAMP)  ## ruff (lint + format check) and mypy over every package
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/mypy dlreplay capture analyze replay

bench: $(STAMP)  ## reproducible measurements (ratios against baselines measured in the same run)
	$(PY) benchmarks/ingest.py
	$(PY) benchmarks/capture_overhead.py
	$(PY) benchmarks/distill.py
	$(PY) benchmarks/fidelity.py
	$(PY) benchmarks/replay_bandwidth.py
	$(PY) benchmarks/export.py
	$(PY) benchmarks/scale.py
	$(PY) benchmarks/memory.py

clean:  ## remove the virtualenv and generated outputs
	rm -rf $(VENV) demo-out bench-data .pytest_cache
