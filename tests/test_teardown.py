"""Leaving the process group: every object holding it (the DDP wrapper) is gone first, whether the run finished or
failed. A DDP reducer holding the last reference destroys the group under the GIL and can hang the rank for good
(seen in a two-node test run); gptlab.runtime.distributed.teardown says why. Real gloo ranks under torchrun."""

from __future__ import annotations

import json

import pytest

from helpers.cli import cli_env, run_cli
from helpers.paths import pythonpath_with_tests


@pytest.mark.slow  # two torchrun launches, ~10 s
@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode, outcome", [("finish", "finished"), ("fail", "injected failure in the loop")])
def test_no_ddp_wrapper_is_alive_when_the_group_is_left(tmp_path, mode, outcome):
    env = cli_env(OMP_NUM_THREADS="1", PYTHONPATH=pythonpath_with_tests())
    proc = run_cli(
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "helpers.teardown_worker",
        str(tmp_path),
        mode,
        env=env,
        cwd=tmp_path,
        timeout=200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record == {"alive_at_teardown": [0], "outcome": outcome}, rank
