"""pytest's conftest: the hermetic environment every test runs in (no network, W&B offline into a temp dir, HF hub
offline) and shared fixtures. Plain helpers live in the helpers package (tests/helpers/)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path

import pytest

from helpers import machine
from helpers.peaks import warm_peaks

# OpenMP threads sleep when they run out of work instead of spinning (libgomp's default spins): under pytest-xdist
# two workers share the two cores, and a spinning idle thread burns the core the other worker needs. Measured on
# 2026-11-27 (2 cores, 6 test files, 336 tests): serial 251 s; `-n 2` 197 s with 105 s more CPU time spent spinning;
# `-n 2` with this 148 s. Set before any test imports torch, inherited by the workers and every CLI a test starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# huggingface_hub and datasets read their offline switches once, when imported, and in-process tests import them in
# this process: set here, before any test module is collected, not only per test (hermetic_env). Set per test only,
# a Hub name that is not a local folder went to the network in-process and retried for 23 s before it failed
# (test_interop_hf's refusals; the same one-line error, from the offline path now).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
# A sweep a test launches runs no timing session after its runs (as `gptlab-sweep --no-timing`): a session costs 2-4 s
# per sweep even at test sizes, and the timing.json it writes would give gptlab-compare speed figures the test did not
# ask for. tests/sweep/test_sweep_timing.py turns it on (with GPTLAB_TIMING_DEFAULTS for tiny sessions).
os.environ.setdefault("GPTLAB_SWEEP_TIMING", "off")


@pytest.fixture(autouse=True)
def hermetic_env(request, tmp_path_factory, monkeypatch):
    """Every test runs offline, with W&B and HF caches under a private temp dir (one per xdist worker)."""
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
    if "heavy" in request.keywords or "slow" in request.keywords:  # light tests train with a peak given, or not
        warm_peaks(base / "gptlab-cache")  # the matmul peaks its runs read, once per worker (helpers/peaks.py)
    with _logging_restored(), _environ_restored():
        yield


@contextlib.contextmanager
def _environ_restored():
    """Each test leaves os.environ as it found it, whatever the code it ran set: in-process code under test may
    export variables (gptlab.runtime.distributed.export_slurm_env writes RANK, WORLD_SIZE, MASTER_ADDR), and
    monkeypatch undoes only what it set itself. A WORLD_SIZE=2 left behind made a later in-process run on the same
    worker wait 30 min for a rank that never came (CI ran out of time on it)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        if dict(os.environ) != saved:
            for key in set(os.environ) - set(saved):
                del os.environ[key]
            os.environ.update(saved)


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
        "--store-durations",
        action="store_true",
        help=f"write each test's time and each shared fixture's setup time to {DURATIONS.name} beside this conftest "
        "(`make durations`: the whole suite); the `heavy` marker of `make test-fast` is read from it",
    )
    parser.addoption(
        "--machine-probe",
        action="store_true",
        help="time a fixed piece of CPU work before the tests start and after they end and print it with the summary "
        "(and into durations.json with --store-durations): the machine's speed beside the suite's time",
    )
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
    if report.when == "setup" and _SHARED_SETUPS:  # --store-durations: to the controller with the report
        report.user_properties.extend(("shared_fixture_setup", entry) for entry in _SHARED_SETUPS)
        _SHARED_SETUPS.clear()
    budget = item.config.getoption("--budget")
    if budget and report.when == "call" and report.passed and "slow" not in item.keywords:
        if report.duration > budget:
            report.outcome = "failed"
            report.longrepr = (
                f"{item.nodeid} took {report.duration:.1f} s, over the {budget:g} s budget of a test outside the "
                "`slow` marker: mark it @pytest.mark.slow or make it fast"
            )


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns each xdist_group mark into the item's group
def pytest_collection_modifyitems(config, items):
    """How pytest-xdist (`make test`: `-n auto --dist loadgroup`) hands tests to its workers; inert without -n.

    - The SLURM tests share one worker: the one-node cluster has slots for one test's jobs at a time, and two tests
      queueing behind each other would run out their deadlines.
    - Every other test goes with its file, so a module-scoped fixture (a trained run, the benchmarks' quick run)
      is built once, not once per worker.
    - The groups are handed out longest first by their recorded time (tests/durations.json; a test it does not
      know counts UNRECORDED_S, or UNRECORDED_SLOW_S when marked `slow`), so the suite does not end on one worker
      running a long file while the other waits: the longest-processing-time-first rule, whose last group to
      start is among the shortest.
    """
    recorded = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {"fixtures": {}, "tests": {}}
    _mark_heavy(items, recorded)
    if not config.getoption("loadgroup", False):  # an xdist worker under --dist loadgroup (xdist sets it there)
        return
    groups = {item: "slurm" if "slurm" in item.keywords else item.path.relative_to(config.rootpath).as_posix()
              for item in items}  # fmt: skip
    seconds: dict[str, float] = {}
    for item, group in groups.items():
        default = UNRECORDED_SLOW_S if "slow" in item.keywords else UNRECORDED_S
        seconds[group] = seconds.get(group, 0.0) + recorded["tests"].get(_plain_id(item.nodeid), default)
    items.sort(key=lambda item: (-seconds[groups[item]], groups[item]))  # stable: each group keeps its own order
    for item in items:
        _in_group(item, groups[item])


def _in_group(item, group: str) -> None:
    """Put a test in an xdist group. pytest-xdist 3.8 reads the group from an '@group' suffix it appends to
    `item._nodeid`; pytest 9.2 keeps node ids structured in `item._id`, so the suffix never lands and loadgroup
    scatters every group over the workers without a word (pytest-xdist issue 1386, open). The suffix goes on the
    structured id here; on an older pytest xdist's own hook adds it."""
    item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(item, "_id"):
        from _pytest.nodeid import coerce_node_id

        item._id = coerce_node_id(f"{item.nodeid}@{group}")


# ---- the fast tier: `heavy` from recorded times ---------------------------------------------------------------------
# tests/durations.json holds, from a whole run of the suite under `make test`'s two workers (`make durations`), each
# test's time (setup + call + teardown) and the setup time of each shared (module/session-scoped) fixture that took
# HEAVY_S or more. At collection a test is marked `heavy` when its own recorded time is HEAVY_S or more, or when it
# uses such a fixture that took SHARED_HEAVY_S or more: its first user paid for it in the recorded run, but any user
# may be first in a selection. The light tests left (not slow, not SLURM) count, fastest first, up to FAST_BUDGET_S
# of recorded time, a lighter shared fixture's setup once with the first of its users (it is set up once per file's
# worker; the recorded user that paid for it is heavy by its own time); the slower rest is heavy too, so the tier
# stays ~2 min of wall as the suite's tests get faster and more of them come under HEAVY_S (or, recorded on a slower
# machine, fewer). `make test-fast` leaves heavy tests out; every other selection (make test, the floor run, -k)
# ignores the mark. A test the file does not know yet counts as light (0 s) until the file is written again.
DURATIONS = Path(__file__).with_name("durations.json")
HEAVY_S = 1.0
# a shared fixture this slow keeps all its users out of the tier; a lighter one costs its setup once
SHARED_HEAVY_S = 5.0
UNRECORDED_S, UNRECORDED_SLOW_S = 1.0, 30.0  # what a test durations.json does not know counts when groups are ordered
FAST_BUDGET_S = 200.0  # two workers' recorded seconds: test-fast ~2 min 10 s of wall where it was recorded
_SHARED_SETUPS: list[list] = []  # [fixture key, seconds] of shared fixtures set up for the test in setup now
_RECORD: dict = {"on": False, "tests": {}, "fixtures": {}}  # --store-durations: timed everywhere, kept by the
# controller (or the one process without xdist)


def pytest_configure(config):
    _RECORD["on"] = config.getoption("--store-durations")


_PROBE: dict = {}  # --machine-probe: the controller's timings of helpers.machine's work, "start" and "end"


def _probing(config) -> bool:
    return config.getoption("--machine-probe") and not hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)  # before xdist starts its workers (its own hook is trylast): the machine is quiet
def pytest_sessionstart(session):
    if _probing(session.config):
        _PROBE["start"] = machine.probe()


def pytest_terminal_summary(terminalreporter, config):
    if _probing(config) and "end" in _PROBE:
        terminalreporter.write_line(machine.line(_PROBE["start"], _PROBE["end"]))


def _fixture_key(baseid: str, name: str) -> str:
    """A shared fixture: where it is defined (a node id prefix: its test file, or "tests" for tests/conftest.py) and
    its name, e.g. "tests/test_train.py::default_run"."""
    return f"{baseid}::{name}"


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    t0 = time.perf_counter()
    yield
    seconds = time.perf_counter() - t0
    if _RECORD["on"] and fixturedef.scope != "function" and seconds >= HEAVY_S:
        _SHARED_SETUPS.append([_fixture_key(fixturedef.baseid, fixturedef.argname), round(seconds, 2)])


def _plain_id(nodeid: str) -> str:
    """A node id without the '@group' suffix that _in_group gives it under loadgroup."""
    base, at, group = nodeid.rpartition("@")
    return base if at and (group == "slurm" or group.endswith(".py")) else nodeid


def pytest_runtest_logreport(report):
    if not _RECORD["on"]:
        return
    nodeid = _plain_id(report.nodeid)
    _RECORD["tests"][nodeid] = round(_RECORD["tests"].get(nodeid, 0.0) + report.duration, 3)
    for name, value in report.user_properties:
        if name == "shared_fixture_setup":
            key, seconds = value
            _RECORD["fixtures"][key] = max(seconds, _RECORD["fixtures"].get(key, 0.0))


def pytest_sessionfinish(session):
    if _probing(session.config) and "start" in _PROBE:  # every test has finished: the machine is quiet again
        _PROBE["end"] = machine.probe()
    if _RECORD["on"] and not hasattr(session.config, "workerinput"):  # an xdist worker's reports reach the controller
        doc: dict = {"heavy_s": HEAVY_S}
        if "end" in _PROBE:
            doc["machine_probe"] = {"start": _PROBE["start"], "end": _PROBE["end"]}
        doc["fixtures"] = dict(sorted(_RECORD["fixtures"].items()))
        doc["tests"] = dict(sorted(_RECORD["tests"].items()))
        DURATIONS.write_text(json.dumps(doc, indent=0) + "\n")


def _mark_heavy(items, doc: dict) -> None:
    """Mark `heavy` the tests that durations.json (doc) recorded at HEAVY_S or more, the users of its fixtures that
    took SHARED_HEAVY_S or more, and the light tests past FAST_BUDGET_S of recorded time (fastest first, a lighter
    shared fixture's setup counted with its first user; the same marks on every xdist worker); without the file (an
    empty doc) nothing is marked."""
    shared = doc["fixtures"]  # "baseid::name": setup seconds
    where = {key: key.rpartition("::") for key in shared}  # (baseid, "::", name)
    light = []
    for item in items:
        seconds = doc["tests"].get(_plain_id(item.nodeid), 0.0)
        uses = [
            key for key, (base, _, name) in where.items() if name in item.fixturenames and item.nodeid.startswith(base)
        ]
        if seconds >= HEAVY_S or any(shared[key] >= SHARED_HEAVY_S for key in uses):
            item.add_marker(pytest.mark.heavy)
        elif "slow" not in item.keywords and "slurm" not in item.keywords:
            light.append((seconds, item.nodeid, item, uses))
    spent, set_up = 0.0, set()
    for seconds, _, item, uses in sorted(light, key=lambda t: t[:2]):
        setups = sum(shared[key] for key in uses if key not in set_up)
        if spent + seconds + setups > FAST_BUDGET_S:
            item.add_marker(pytest.mark.heavy)
            continue
        spent += seconds + setups
        set_up.update(uses)
