"""pytest's conftest: the hermetic environment every test runs in (no network, W&B offline into a temp dir, HF hub
offline) and shared fixtures. Plain helpers live in the helpers package (tests/helpers/)."""

from __future__ import annotations

import contextlib
import logging

import pytest


@pytest.fixture(autouse=True)
def hermetic_env(tmp_path_factory, monkeypatch):
    """Every test runs offline, with W&B and HF caches under a private temp dir."""
    base = tmp_path_factory.getbasetemp() / "env"
    for sub in ("wandb", "wandb-cache", "wandb-data", "wandb-artifacts", "wandb-config", "gptlab-cache"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(base / "wandb"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(base / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(base / "wandb-data"))
    monkeypatch.setenv("WANDB_ARTIFACT_DIR", str(base / "wandb-artifacts"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(base / "wandb-config"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    # wandb.init in this process exports WANDB_SERVICE; without this, a CLI subprocess of a later test would
    # attach to pytest's W&B service instead of starting its own
    monkeypatch.delenv("WANDB_SERVICE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("GPTLAB_CACHE", str(base / "gptlab-cache"))
    with _logging_restored():
        yield


@contextlib.contextmanager
def _logging_restored():
    """Each test leaves logging as it found it: an in-process Hydra run configures handlers on the stream of its
    moment (a test's captured stderr, closed once that test ends), and a later test's log line would then print
    '--- Logging error ---' into its own stderr."""
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in list(logging.root.manager.loggerDict))]
    saved = [
        (lg, lg.handlers[:], lg.level, lg.propagate, lg.disabled) for lg in loggers if isinstance(lg, logging.Logger)
    ]
    try:
        yield
    finally:
        for lg, handlers, level, propagate, disabled in saved:
            lg.handlers[:] = handlers
            lg.level, lg.propagate, lg.disabled = level, propagate, disabled


@pytest.fixture
def one_thread():
    """torch on one thread for the test (profiler timings stay comparable), the caller's count restored after."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_addoption(parser):
    parser.addoption(
        "--budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="fail a test outside the `slow` marker whose call takes longer than this (CI: 30); a slow test is marked "
        "slow or made fast when it is written",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """--budget: a passing test outside `slow` over the budget fails, naming its time and the two ways out."""
    outcome = yield
    report = outcome.get_result()
    budget = item.config.getoption("--budget")
    if budget and report.when == "call" and report.passed and "slow" not in item.keywords:
        if report.duration > budget:
            report.outcome = "failed"
            report.longrepr = (
                f"{item.nodeid} took {report.duration:.1f} s, over the {budget:g} s budget of a test outside the "
                "`slow` marker: mark it @pytest.mark.slow or make it fast"
            )


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n 2 --dist loadgroup`, as `make test` runs) the SLURM tests share one worker: the one-node
    cluster has slots for one test's jobs at a time, and two tests queueing behind each other would run out their
    deadlines. Without xdist the mark is inert."""
    for item in items:
        if "slurm" in item.keywords:
            item.add_marker(pytest.mark.xdist_group("slurm"))
