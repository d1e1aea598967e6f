# Quick start:  make run   (set up .venv, train the default model)   |   make test   (set up .venv, run the tests)
VENV  ?= .venv
PY    := $(VENV)/bin/python
# The CPU build of torch; on a GPU machine install your CUDA build into .venv first (pip skips it then).
TORCH ?= torch==2.13.0
PYTHON ?= python3

.PHONY: setup run test test-fast lint bench gpu-check clean
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

run: setup
	$(VENV)/bin/gptlab-train $(ARGS)

test: setup
	$(VENV)/bin/pytest -q $(ARGS)

test-fast: setup
	$(VENV)/bin/pytest -q -m "not slow and not slurm" $(ARGS)

# ruff lint and format check (pyproject.toml [tool.ruff]) and mypy type checks (pyproject.toml [tool.mypy]); CI runs it before the tests
lint: setup
	$(VENV)/bin/ruff check gptlab benchmarks && $(VENV)/bin/ruff format --check gptlab benchmarks && $(VENV)/bin/mypy gptlab

# Measure this machine (~30 min on 2 cores) and write docs/BENCHMARKS.md + docs/benchmarks.json; ARGS="--quick" ~3 min (AMX CPU), ~9 min (2-core AVX2 EPYC: emulated bf16)
bench: setup
	$(PY) -m benchmarks $(ARGS)

# Check every CUDA code path on this machine's GPU(s) and write docs/GPU.md + docs/gpu.json (ARGS="--quick" for
# small sizes); without CUDA it says so in one line and exits 0
gpu-check: setup
	$(PY) -m benchmarks --gpu $(ARGS)

clean:
	rm -rf $(VENV) outputs/runs outputs/sweeps
