"""LoadSampler: exact shares from given counters, and real /proc readings with a busy process outside and inside."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gptlab.runtime import cpu_load as load
from gptlab.runtime.cpu_load import LoadSampler, job_sampler, machine_ticks, own_ticks

linux_only = pytest.mark.skipif(not load.available(), reason="needs Linux /proc")
BUSY = "import time\nt = time.perf_counter()\nwhile time.perf_counter() - t < {s}: pass\n"


def _fake(readings):
    """Sampler over scripted (busy, total, n_cores, own) readings, one per read."""
    it = iter(readings)
    current = {}

    def machine():
        current["r"] = next(it)
        return current["r"][:3]

    return LoadSampler(machine=machine, own=lambda: current["r"][3])


def test_share_is_outside_busy_over_all_cores_time_weighted():
    # 2 cores: interval 1 = 100 ticks/core, others busy 50 of 200 -> 0.25; interval 2 = 300 ticks, 240 others.
    s = _fake([(0, 0, 2, 0), (80, 200, 2, 30), (80 + 300, 200 + 300, 2, 30 + 60)])
    s.start()
    s.sample()
    assert (s.outside_ticks, s.total_ticks, s.own_ticks) == (50, 200, 30)
    assert s.mean() == pytest.approx((50 + 240) / 500)
    assert s.own_share() == pytest.approx(90 / 500)


def test_short_intervals_accumulate_until_long_enough_and_mean_closes_the_last():
    # 15 ticks on 2 cores is below MIN_TICKS_PER_CORE: the interval stays open, nothing is counted yet.
    s = _fake([(0, 0, 2, 0), (10, 15, 2, 0), (30, 60, 2, 10), (40, 70, 2, 10)])
    s.start()
    s.sample()
    assert s.total_ticks == 0
    s.sample()
    assert (s.outside_ticks, s.total_ticks) == (20, 60)
    assert s.mean() == pytest.approx((20 + 10) / 70)  # the open 10-tick interval is closed by mean()


def test_own_ticks_above_busy_never_give_a_negative_share_and_no_proc_gives_none():
    s = _fake([(0, 0, 1, 0), (10, 100, 1, 12)])
    s.start()
    assert s.mean() == 0.0
    missing = LoadSampler(machine=lambda: None, own=lambda: 0)
    missing.start()
    missing.sample()
    assert missing.mean() is None and missing.own_share() is None
    assert LoadSampler().mean() is None  # never started
    assert machine_ticks(proc=load.PROC / "no-such-dir") is None


@linux_only
def test_a_busy_process_outside_this_one_raises_the_share():
    """An orphaned busy loop (not our descendant) for ~1 s is outside load: >= 0.3 of one core's worth."""
    n_cores = machine_ticks()[2]
    s = LoadSampler()
    s.start()
    # `sh -c '... &'` exits at once, so the busy python is re-parented: not ours, as another user's job would be.
    subprocess.run(["sh", "-c", f"'{sys.executable}' -c '{BUSY.format(s=1.0)}' >/dev/null 2>&1 &"], check=True)
    time.sleep(1.3)
    share = s.mean()
    # Other users' load can only add to the share, so the bound holds on a busy shared machine too.
    assert share is not None and share >= 0.3 / n_cores


@linux_only
def test_own_work_and_own_children_are_not_outside_load():
    """Ticks this process and a child burn are counted as ours (matching os.times) and left out of the share."""
    s = LoadSampler()
    s.start()
    before = os.times()
    child = subprocess.Popen([sys.executable, "-c", BUSY.format(s=0.8)])
    exec(BUSY.format(s=0.8))  # busy in this process meanwhile
    s.sample(force=True)  # the child is still ours while it runs (live descendant)
    child.wait()
    share = s.mean()
    after = os.times()
    used = sum(after[:4]) - sum(before[:4])  # own + waited children's CPU seconds
    ticks = os.sysconf("SC_CLK_TCK")
    assert s.own_ticks / ticks == pytest.approx(used, abs=0.1 + 0.1 * used)
    assert used > 0.3  # at least the in-process loop ran
    # outside = machine busy - own: everything we burnt is excluded, so share + own share <= 1.
    assert share is not None and 0.0 <= share <= 1.0 - s.own_share() + 0.02


@linux_only
def test_own_ticks_reads_a_live_child():
    child = subprocess.Popen([sys.executable, "-c", BUSY.format(s=0.6)])
    try:
        start = own_ticks(pid=str(child.pid))
        time.sleep(0.5)
        assert own_ticks(pid=str(child.pid)) > start  # its utime grows while it spins
        assert own_ticks() >= own_ticks(pid=str(child.pid))  # our tree includes the child
    finally:
        child.wait()


@linux_only
def test_a_multi_rank_job_counts_its_sibling_ranks_as_its_own():
    """With local_world > 1 'own' is the launcher's tree, so a sibling rank's work is not outside load."""
    sibling = subprocess.Popen([sys.executable, "-c", BUSY.format(s=0.6)])  # stands in for rank 1
    try:
        root = str(load.Path(load.__file__).parents[2])
        code = (
            f"import sys, time; sys.path.insert(0, {root!r}); from gptlab.runtime.cpu_load import job_sampler; "
            "s = job_sampler(2); s.start(); time.sleep(0.5); s.sample(force=True); print(s.own_ticks)"
        )
        rank0 = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    finally:
        sibling.wait()
    # The parent (this test process) tree holds the busy sibling: >= 0.25 s of its ticks count as ours.
    assert int(rank0.stdout) >= 0.25 * os.sysconf("SC_CLK_TCK")
    assert job_sampler(1)._own is own_ticks  # one rank: just this process tree


def test_a_sweep_siblings_load_is_counted_apart_from_foreign_load():
    # 2 cores, 200 ticks: 150 busy; this run 60, its whole sweep (queue + sibling runs) 110 -> sibling 50, foreign 40
    readings = iter([(0, 0, 2, 0, 0), (150, 200, 2, 60, 110), (150, 200, 2, 60, 110)])
    current = {}

    def machine():
        current["r"] = next(readings)
        return current["r"][:3]

    s = LoadSampler(machine=machine, own=lambda: current["r"][3], sweep=lambda: current["r"][4])
    s.start()
    s.sample()
    assert (s.outside_ticks, s.sibling_ticks, s.own_ticks, s.total_ticks) == (40, 50, 60, 200)
    assert s.mean() == pytest.approx(0.2) and s.sibling_share() == pytest.approx(0.25)
    alone = _fake(
        [(0, 0, 2, 0), (150, 200, 2, 60), (150, 200, 2, 60)]
    )  # no sweep: everyone else is outside load, as before
    alone.start()
    assert alone.mean() == pytest.approx(90 / 200) and alone.sibling_share() == 0.0


@linux_only
def test_a_queued_run_counts_the_queues_other_runs_as_siblings(monkeypatch):
    """GPTLAB_SWEEP_PID (set by the local queue) names the sweep's root: a busy sibling under it is not foreign."""
    sibling = subprocess.Popen([sys.executable, "-c", BUSY.format(s=0.8)])  # the queue's other run: our child here
    try:
        monkeypatch.setenv(load.SWEEP_PID_ENV, str(os.getpid()))  # this test process plays the queue
        root = str(load.Path(load.__file__).parents[2])
        code = (
            f"import sys, time; sys.path.insert(0, {root!r}); from gptlab.runtime.cpu_load import job_sampler; "
            "s = job_sampler(1); s.start(); time.sleep(0.6); s.sample(force=True); print(s.sibling_ticks)"
        )
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    finally:
        sibling.wait()
    assert int(run.stdout) >= 0.25 * os.sysconf("SC_CLK_TCK")  # the sibling's spin, not foreign load
