"""The environment every test runs in (tests/conftest.py): what one test sets does not reach the next, and a stuck
test fails by name instead of running CI into its time limit."""

from __future__ import annotations

import os

from helpers.scratch import run_pytest, scratch_suite


def test_what_a_test_exports_is_gone_for_the_next_one(tmp_path):
    """A test whose in-process code exports WORLD_SIZE (export_slurm_env does) left it to every later test on its
    worker: a later in-process run with hardware=ddp_cpu then waited 30 min for a second rank. Scratch suite, real
    conftest: the first test adds and changes variables the way code under test does, the second sees none of it."""
    test_env = (
        "import os\n"
        "def test_exports():\n"
        "    os.environ.update(WORLD_SIZE='2', RANK='1', MASTER_ADDR='gpu07')\n"
        "    os.environ['GPTLAB_SCRATCH_KEPT'] = 'changed'\n"
        "    del os.environ['GPTLAB_SCRATCH_GONE']\n"
        "def test_sees_none_of_it():\n"
        "    assert not {'WORLD_SIZE', 'RANK', 'MASTER_ADDR'} & set(os.environ)\n"
        "    assert os.environ['GPTLAB_SCRATCH_KEPT'] == 'kept'\n"
        "    assert os.environ['GPTLAB_SCRATCH_GONE'] == 'here'\n"
    )
    scratch_suite(tmp_path, {"test_env.py": test_env})
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR")}
    env.update(GPTLAB_SCRATCH_KEPT="kept", GPTLAB_SCRATCH_GONE="here")
    done = run_pytest(tmp_path, "-q", "-p", "no:xdist", "test_env.py", env=env)
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout[-3000:]


def test_a_stuck_test_fails_by_name(pytestconfig):
    """pytest-timeout (pyproject.toml): a test over 20 min fails with its stack and the suite goes on; above the
    slowest test's ~6 min on 2 cores (the benchmarks' quick run, its fixture included)."""
    assert float(pytestconfig.getini("timeout")) == 1200
