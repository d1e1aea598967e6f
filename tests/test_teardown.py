"""Leaving the process group: every object holding it (the DDP wrapper) is gone first, whether the run finished or
failed. A DDP reducer holding the last reference destroys the group under the GIL and can hang the rank for good
(seen in a two-node test run); gptlab.runtime.distributed.teardown says why. Real gloo ranks under torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


@pytest.mark.slow  # two torchrun launches, ~10 s
@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode, outcome", [("finish", "finished"), ("fail", "injected failure in the loop")])
def test_no_ddp_wrapper_is_alive_when_the_group_is_left(tmp_path, mode, outcome):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(TESTS / "teardown_worker.py"), str(tmp_path), mode], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record == {"alive_at_teardown": [0], "outcome": outcome}, rank
