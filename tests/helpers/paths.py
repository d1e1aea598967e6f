"""Where things are: the repository root, its conf/ and this tests/ folder."""

from __future__ import annotations

import os
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
CONF_DIR = REPO / "conf"


def pythonpath_with_tests() -> str:
    """PYTHONPATH for a child process that imports the helpers package (`-m helpers.ddp_worker`): tests/ first,
    then this process's PYTHONPATH (a scratch copy of the project may put its own gptlab there)."""
    return os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
