"""The test-time budget (conftest.py --budget, CI: 30 s): a test outside `slow` over it fails with one clear line; a
slow-marked one and a fast one pass."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_a_test_over_the_budget_fails_unless_marked_slow(tmp_path):
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: long\n")
    (tmp_path / "test_b.py").write_text(
        "import time, pytest\n"
        "def test_fast(): pass\n"
        "def test_over(): time.sleep(0.6)\n"
        "@pytest.mark.slow\n"
        "def test_slow_over(): time.sleep(0.6)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--budget", "0.3", "test_b.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout
    assert "1 failed, 2 passed" in done.stdout
    assert re.search(
        r"test_b.py::test_over took \d+\.\d s, over the 0.3 s budget of a test outside the `slow`", done.stdout
    )
    plain = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_b.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert plain.returncode == 0 and "3 passed" in plain.stdout  # no --budget: no budget


def test_under_xdist_each_file_runs_on_one_worker_and_files_with_slow_tests_go_first(tmp_path):
    """`make test`'s -n auto --dist loadgroup: a file's tests share one worker (a module fixture is built once), every
    slurm-marked test shares one worker, and files holding slow tests are handed out first. Checked on the worker
    each test ran on, with the real conftest, in a scratch folder of three files."""
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: long\n    slurm: cluster\n")
    for name in ("a", "b"):
        cases = "".join(f"def test_{name}{i}(): pass\n" for i in range(8))
        (tmp_path / f"test_{name}.py").write_text(
            f"import pytest\n{cases}@pytest.mark.slurm\ndef test_{name}_sl(): pass\n"
        )
    (tmp_path / "test_z.py").write_text("import pytest\n@pytest.mark.slow\ndef test_z(): pass\ndef test_z2(): pass\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
         "--no-loadscope-reorder", "."],
        cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
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
