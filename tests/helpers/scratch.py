"""A scratch pytest suite with the real tests/conftest.py, run as its own pytest process: how the conftest's
hooks and fixtures behave is checked on tests written for the purpose (test_budget.py, test_conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


def scratch_suite(root: Path, files: dict[str, str], markers: tuple[str, ...] = ()) -> Path:
    """root holding the real conftest with the helpers package it imports, a pytest.ini declaring `markers`
    ('name: help'), and the test files."""
    shutil.copy(CONFTEST, root / "conftest.py")
    shutil.copytree(CONFTEST.parent / "helpers", root / "helpers", ignore=shutil.ignore_patterns("__pycache__"))
    ini = ["[pytest]", *(["markers ="] if markers else []), *(f"    {m}" for m in markers)]
    (root / "pytest.ini").write_text("\n".join(ini) + "\n")
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def run_pytest(root: Path, *args: str, timeout: int = 180, env: dict | None = None) -> subprocess.CompletedProcess:
    """pytest in root, without the cache provider (the scratch folder stays as written); env (default: this
    process's) gets GPTLAB_TEST_WARM_PEAKS=0, as scratch tests train nothing (helpers/peaks.py)."""
    env = dict(os.environ if env is None else env, GPTLAB_TEST_WARM_PEAKS="0")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=root, capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip
