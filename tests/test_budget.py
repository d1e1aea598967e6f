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
