"""The test-time budget (conftest.py --budget, CI: 30 s): a test outside `slow` over it fails with one clear line; a
slow-marked one and a fast one pass."""

from __future__ import annotations

import json
import re

from helpers.scratch import run_pytest, scratch_suite


def test_a_test_over_the_budget_fails_unless_marked_slow(tmp_path):
    test_b = (
        "import time, pytest\n"
        "def test_fast(): pass\n"
        "def test_over(): time.sleep(0.6)\n"
        "@pytest.mark.slow\n"
        "def test_slow_over(): time.sleep(0.6)\n"
    )
    scratch_suite(tmp_path, {"test_b.py": test_b}, markers=("slow: long",))
    done = run_pytest(tmp_path, "-q", "--budget", "0.3", "test_b.py")
    assert done.returncode == 1, done.stdout
    assert "1 failed, 2 passed" in done.stdout
    assert re.search(
        r"test_b.py::test_over took \d+\.\d s, over the 0.3 s budget of a test outside the `slow`", done.stdout
    )
    plain = run_pytest(tmp_path, "-q", "test_b.py")
    assert plain.returncode == 0 and "3 passed" in plain.stdout  # no --budget: no budget


def test_under_xdist_each_file_runs_on_one_worker_and_files_with_slow_tests_go_first(tmp_path):
    """`make test`'s -n auto --dist loadgroup: a file's tests share one worker (a module fixture is built once), every
    slurm-marked test shares one worker, and the groups are handed out longest first: with no recorded times, the
    file holding a slow test. Checked on the worker each test ran on, with the real conftest, in a scratch folder of
    three files."""
    files = {
        f"test_{name}.py": "import pytest\n"
        + "".join(f"def test_{name}{i}(): pass\n" for i in range(8))
        + f"@pytest.mark.slurm\ndef test_{name}_sl(): pass\n"
        for name in ("a", "b")
    }
    files["test_z.py"] = "import pytest\n@pytest.mark.slow\ndef test_z(): pass\ndef test_z2(): pass\n"
    scratch_suite(tmp_path, files, markers=("slow: long", "slurm: cluster"))
    done = run_pytest(tmp_path, "-v", "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder", ".")
    assert done.returncode == 0, done.stdout[-3000:]
    ran = re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED (test_\w+)\.py::(test_\w+)", done.stdout)
    assert len(ran) == 20, done.stdout[-3000:]
    workers: dict[str, set[str]] = {}
    for worker, module, test in ran:
        workers.setdefault("slurm" if test.endswith("_sl") else module, set()).add(worker)
    assert all(len(w) == 1 for w in workers.values()), workers  # one worker per file, and for the slurm tests
    assert set(workers) == {"test_a", "test_b", "test_z", "slurm"}
    first = {worker: test for worker, _, test in reversed(ran)}  # each worker's first test
    assert "test_z" in first.values() or "test_z2" in first.values()  # the file with a slow test started first


def test_under_xdist_the_group_with_the_most_recorded_time_goes_first(tmp_path):
    """With tests/durations.json, groups are ordered by their recorded seconds (longest first), whatever their marks:
    test_c's recorded 50 s put it ahead of test_z's slow test (30 s when unrecorded), and both ahead of test_a and
    test_b, which come first in file order."""
    files = {f"test_{name}.py": "".join(f"def test_{name}{i}(): pass\n" for i in range(4)) for name in ("a", "b", "c")}
    files["test_z.py"] = "import pytest\n@pytest.mark.slow\ndef test_z(): pass\n"
    scratch_suite(tmp_path, files, markers=("slow: long", "slurm: cluster"))
    recorded = {"test_a.py::test_a0": 0.1, "test_b.py::test_b0": 0.1, "test_c.py::test_c0": 50.0}
    (tmp_path / "durations.json").write_text(json.dumps({"heavy_s": 1.0, "fixtures": {}, "tests": recorded}))
    done = run_pytest(tmp_path, "-v", "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder", ".")
    assert done.returncode == 0, done.stdout[-3000:]
    ran = re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED (test_\w+)\.py::(test_\w+)", done.stdout)
    assert len(ran) == 13, done.stdout[-3000:]
    first = {worker: module for worker, module, _ in reversed(ran)}  # the file each worker started with
    assert set(first.values()) == {"test_c", "test_z"}, first  # 50 s and 30 s: the two longest start first
