# Quick start:  make run   (set up .venv, train the default model)   |   make test   (set up .venv, run the tests)
VENV  ?= .venv
PY    := $(VENV)/bin/python
# The CPU build of torch; on a GPU machine install your CUDA build into .venv first (pip skips it then).
TORCH ?= torch==2.13.0
PYTHON ?= python3
# pytest-xdist: a worker per core, the SLURM tests on one worker, each file on one worker, the groups handed out
# longest first by their time in tests/durations.json (tests/conftest.py). XDIST= runs the suite serially in this
# process.
XDIST ?= -n auto --dist loadgroup --no-loadscope-reorder
# The test targets keep Python's bytecode caches (__pycache__/, gitignored) where the environment turns them off
# (PYTHONDONTWRITEBYTECODE=1, as some container images do): else every pytest worker compiles and assert-rewrites
# each test module again at collection (collection 15.3 s without, 9.4 s with) and every CLI compiles gptlab again
test test-fast durations test-floor: export PYTHONDONTWRITEBYTECODE :=

.PHONY: help setup run test test-fast durations floor-setup test-floor lint format bench gpu-check gpu-wheels gpu-study clean
help:  ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 12

setup: $(VENV)/.installed  ## create .venv with the CPU build of torch and gptlab[dev,hf,eval]

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e '.[dev,hf,eval]'
	touch $@

run: setup  ## train the default model (ARGS="attention=gqa ...")
	$(VENV)/bin/gptlab-train $(ARGS)

# --machine-probe: the machine's speed before and after the run, printed with the summary (tests/helpers/machine.py)
test: setup  ## the whole test suite on a worker per core (17–19 min on 2 cores, 28 on a slow day; the 15 slowest listed)
	$(VENV)/bin/pytest -q $(XDIST) --durations=15 --machine-probe $(ARGS)

# The edit-test loop: the tests that took under 1 s each when `make durations` last timed the whole suite, fastest
# first up to a budget of recorded time (tests/durations.json; tests/conftest.py marks the rest `heavy`). A new test
# runs here until the file is rewritten.
test-fast: setup  ## the fastest tests (tests/durations.json): no slow, SLURM or heavy ones (~2 min on 2 cores)
	$(VENV)/bin/pytest -q $(XDIST) -m "not slow and not slurm and not heavy" $(ARGS)

# Time the whole suite as `make test` runs it and write tests/durations.json (commit it): what test-fast leaves out
durations: setup  ## rewrite tests/durations.json from a whole run of the suite (17–19 min on 2 cores, 28 on a slow day)
	$(VENV)/bin/pytest -q $(XDIST) --store-durations --machine-probe $(ARGS)

# The fast tests in a second venv holding the floor versions pyproject declares (.ci/floors.txt: torch, hydra-core,
# omegaconf, wandb, datasets, statsmodels, and the hf/eval extras' transformers and lm-eval): a floor the code does not
# run on fails here. torch 2.9.0 exists on PyPI only as its CUDA build (~6.7 GB venv with the nvidia wheels; it runs
# on CPU). The dev extras but `workspaces` (wandb-workspaces needs wandb >= 0.28.2; its tests skip here), plus hf and
# eval (~1 min more to install). FLOOR_TESTS narrows the tests (default: all fast).
# `make floor-setup` alone builds the venv (CI runs it beside `make lint`: both mostly wait on downloads and unpacking),
# again whenever pyproject.toml or the pins change, as `make setup` does for .venv.
FLOOR_VENV ?= .venv-floor
FLOOR_TESTS ?= tests
floor-setup: $(FLOOR_VENV)/.installed  ## create .venv-floor with pyproject's floor versions (.ci/floors.txt)

$(FLOOR_VENV)/.installed: pyproject.toml .ci/floors.txt
	test -x $(FLOOR_VENV)/bin/python || $(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install -q -c .ci/floors.txt -r .ci/floors.txt -e '.[optuna,gpt2,tensorboard,hf,eval]' \
	  'pytest>=8' 'pytest-timeout>=2.2' 'pytest-xdist>=3.5' 'hypothesis>=6.100'
	$(FLOOR_VENV)/bin/python -m pip check
	touch $@

test-floor: floor-setup  ## the fast tests on pyproject's floor versions (torch, wandb, transformers, lm-eval, ...) in .venv-floor
	$(FLOOR_VENV)/bin/pytest -q $(XDIST) -m "not slow and not slurm" -p no:cacheprovider $(FLOOR_TESTS)

# ruff lint and format check (pyproject.toml [tool.ruff]) and mypy type checks (pyproject.toml [tool.mypy]); CI runs it before the tests
lint: setup  ## ruff check + ruff format --check (gptlab, benchmarks, tests) and mypy
	$(VENV)/bin/ruff check gptlab hydra_plugins benchmarks tests && $(VENV)/bin/ruff format --check gptlab hydra_plugins benchmarks tests && $(VENV)/bin/mypy gptlab

format: setup  ## ruff --fix and ruff format, in place
	$(VENV)/bin/ruff check --fix gptlab hydra_plugins benchmarks tests && $(VENV)/bin/ruff format gptlab hydra_plugins benchmarks tests

# Measure this machine (~30 min on 2 cores) and write docs/BENCHMARKS.md + docs/benchmarks.json; ARGS="--quick" ~3 min (AMX CPU), ~9 min (2-core AVX2 EPYC: emulated bf16)
bench: setup  ## measure this machine, write docs/BENCHMARKS.md (ARGS="--quick")
	$(PY) -m benchmarks $(ARGS)

# Check every CUDA code path on this machine's GPU(s) and write docs/GPU.md + docs/gpu.json (ARGS="--quick" for
# small sizes); without CUDA it says so in one line and exits 0
gpu-check: setup  ## every CUDA path on this machine's GPU(s), write docs/GPU.md
	$(PY) -m benchmarks --gpu $(ARGS)

# The GPU study for one short lent window (docs/DEVELOPMENT.md, "The GPU study"): `make gpu-wheels` here (a package
# index), then on the GPU machine `scripts/gpu-study.sh --budget 420` with the image's own torch. `make gpu-study`
# is that script for a GPU machine whose python3 already has gptlab's dependencies; ARGS="--dry-run --out DIR" runs
# it on this CPU at tiny sizes
gpu-wheels: setup  ## build .gpu-wheels/ (what a lent GPU machine lacks) from scripts/gpu-wheels.txt
	PY=$(PY) scripts/gpu-wheelhouse.sh

gpu-study:  ## the GPU study (scripts/gpu-study.sh): docs/GPU.md with the d12 table; ARGS="--budget 420"
	scripts/gpu-study.sh $(ARGS)

clean:  ## remove .venv and outputs/
	rm -rf $(VENV) outputs/runs outputs/sweeps
