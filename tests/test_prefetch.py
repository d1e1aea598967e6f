"""train.prefetch: batches drawn ahead in a thread give the same curve as drawing them in the training thread,
fresh and resumed; the thread runs ahead by at most its depth, hands its errors on, and never outlives train()."""

from __future__ import annotations

import json
import math
import os
import signal
import threading
from types import SimpleNamespace

import pytest
import torch

from gptlab.config import build
from gptlab.config.schema import check_schema, curve_free_keys
from gptlab.errors import ConfigError
from gptlab.state import checkpoint, resume
from gptlab.train import loop, prefetch
from gptlab.train.prefetch import THREAD_NAME
from helpers.train import rows, run_inprocess

ARGS = ["train.grad_accum=2", "hardware.threads=1", "train.ckpt_interval=0"]  # 2 micro-batches of 4 per step
B = 8  # train.batch_size in helpers.train.FAST
CURVE = ("step", "train/loss", "val/loss", "train/grad_norm", "train/lr", "tokens")  # what must match exactly


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def curve(run) -> list[dict]:
    return [{k: r[k] for k in CURVE if k in r} for r in rows(run)]


def final_weights(run) -> dict:
    return checkpoint.load(checkpoint.latest_path(run))["model"]


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class Watched:
    """A run's real data object, recording each train_samples call as (step, thread name), optionally failing."""

    def __init__(self, inner, fail_at: int | None = None):
        self.inner, self.fail_at, self.calls = inner, fail_at, []
        self.changed = threading.Condition()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def train_samples(self, first: int, count: int):
        with self.changed:
            self.calls.append((first // B, threading.current_thread().name))
            self.changed.notify_all()
        if first // B == self.fail_at:
            raise LookupError(f"shard of sample {first} is gone")
        return self.inner.train_samples(first, count)


def watch(monkeypatch, **kw) -> list[Watched]:
    """Wrap the data object the next runs build; returns the list the wrappers are appended to."""
    made, real = [], build.build_data
    monkeypatch.setattr(build, "build_data", lambda *a, **k: made.append(Watched(real(*a, **k), **kw)) or made[-1])
    return made


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same 6-step run (grad_accum 2) with prefetch 0 and 2: {depth: (run dir, summary)}."""
    threads, out = torch.get_num_threads(), {}
    with pytest.MonkeyPatch.context() as env:  # conftest's hermetic_env is per test: set its cache and offline here
        env.setenv("GPTLAB_CACHE", str(tmp_path_factory.getbasetemp() / "env" / "gptlab-cache"))
        env.setenv("HF_HUB_OFFLINE", "1")
        env.setenv("HF_DATASETS_OFFLINE", "1")
        try:
            for depth in (0, 2):
                run = tmp_path_factory.mktemp(f"prefetch{depth}")
                out[depth] = run, run_inprocess(run, f"train.prefetch={depth}", *ARGS)
        finally:
            torch.set_num_threads(threads)
    return out


def test_prefetch_on_and_off_train_bit_identically(pair):
    (off, _), (on, _) = pair[0], pair[2]
    assert len([r for r in rows(on) if "train/loss" in r]) == 6
    assert curve(on) == curve(off)  # every loss, grad norm and val loss, exactly
    assert same_weights(final_weights(on), final_weights(off))
    assert not prefetch_threads()


def test_data_wait_is_in_every_train_row_and_the_summary(pair):
    for run, summary in pair.values():
        train_rows = [r for r in rows(run) if "train/loss" in r]
        assert all(0 <= r["perf/data_ms"] <= r["perf/step_ms"] for r in train_rows)  # part of the step time
        assert 0 <= summary["data_ms_median"] <= summary["step_ms_median"]
        assert json.loads((run / "summary.json").read_text())["data_ms_median"] == summary["data_ms_median"]


def test_stop_then_resume_with_another_prefetch_gives_the_same_curve(pair, tmp_path, monkeypatch, one_thread):
    """A stop signal after step 3 ends train() early (no thread left); the resume draws from step 3 on."""
    real_emit, original = loop._emit, signal.getsignal(signal.SIGUSR1)

    def emit_then_signal(sinks, ctx, row, step):
        real_emit(sinks, ctx, row, step)
        if step == 3 and "train/loss" in row:
            os.kill(os.getpid(), signal.SIGUSR1)

    monkeypatch.setattr(loop, "_emit", emit_then_signal)
    try:
        first = run_inprocess(tmp_path, "train.prefetch=3", *ARGS)
    finally:
        signal.signal(signal.SIGUSR1, original)
    assert first["status"] == "preempted" and first["steps"] == 3
    assert not prefetch_threads()
    monkeypatch.setattr(loop, "_emit", real_emit)
    made = watch(monkeypatch)
    second = run_inprocess(tmp_path, "train.prefetch=1", *ARGS)  # a resume may change train.prefetch
    assert second["status"] == "finished" and second["steps"] == 6
    assert sorted({step for step, _ in made[0].calls}) == [3, 4, 5]  # it starts at the resumed step
    assert curve(tmp_path) == curve(pair[0][0])
    assert same_weights(final_weights(tmp_path), final_weights(pair[0][0]))


def test_an_error_while_drawing_is_raised_by_train_and_leaves_no_thread(tmp_path, monkeypatch, one_thread):
    made = watch(monkeypatch, fail_at=3)
    with pytest.raises(LookupError, match=f"^shard of sample {3 * B} is gone$"):
        run_inprocess(tmp_path, "train.prefetch=2", *ARGS)
    assert made[0].calls[0][1] == THREAD_NAME
    assert [r["step"] for r in rows(tmp_path) if "train/loss" in r] == [1, 2, 3]  # raised at step 3, not before
    assert not prefetch_threads()


def test_the_thread_draws_ahead_by_at_most_its_depth(tmp_path, monkeypatch, one_thread):
    """When the row of step n is logged, steps < n were taken: the thread has asked for step n+1, never n+2."""
    made, real_emit, seen = watch(monkeypatch), loop._emit, []

    def emit_and_look(sinks, ctx, row, step):
        real_emit(sinks, ctx, row, step)
        if "train/loss" in row and step + 1 < 6:
            data = made[0]
            with data.changed:  # wait (never a sleep-and-hope) for the thread to reach step n+1
                assert data.changed.wait_for(lambda: max(s for s, _ in data.calls) >= step + 1, timeout=60)
                seen.append((step, max(s for s, _ in data.calls)))

    monkeypatch.setattr(loop, "_emit", emit_and_look)
    run_inprocess(tmp_path, "train.prefetch=2", *ARGS)
    assert seen == [(n, n + 1) for n in range(1, 5)]  # ahead, and by no more than 2 steps
    assert {name for _, name in made[0].calls} == {THREAD_NAME}
    assert [s for s, _ in made[0].calls] == [s for s in range(6) for _ in range(2)]  # each step once, in order


def test_a_skipped_step_goes_on_to_the_next_steps_batch(tmp_path, monkeypatch, one_thread):
    """A non-finite step is dropped (train.nan_skip) and the loop trains the next step's batch, as before prefetch."""
    real_step, seen = loop.train_step, {}

    def nan_on_third(run, batches, *rest):
        calls = seen.setdefault(depth, [])
        calls.append(torch.cat([x for x, _ in batches]).clone())
        loss, grad_norm, terms = real_step(run, batches, *rest)
        return (torch.tensor(math.nan) if len(calls) == 3 else loss), grad_norm, terms  # device tensors, read later

    monkeypatch.setattr(loop, "train_step", nan_on_third)
    for depth in (0, 2):
        run_inprocess(tmp_path / str(depth), f"train.prefetch={depth}", "train.nan_skip=1", *ARGS)
    assert [r["step"] for r in rows(tmp_path / "2") if "train/loss" in r] == [1, 2, 4, 5, 6]
    assert curve(tmp_path / "2") == curve(tmp_path / "0")
    assert len(seen[2]) == len(seen[0]) == 6 and all(torch.equal(a, b) for a, b in zip(seen[2], seen[0]))
    assert not torch.equal(seen[2][2], seen[2][3])  # the step after the skip trained another batch


class Counting:
    """Sample i is the row [i, i]: which samples a batch holds is plain to see."""

    def train_samples(self, first: int, count: int):
        x = torch.arange(first, first + count)[:, None].repeat(1, 2)  # (count, 2)
        return x, x + 1


def test_cuda_batches_are_pinned_in_the_prefetch_thread_on_the_runs_gpu(monkeypatch):
    """No GPU on this machine: pin_memory and set_device are mocked; only who calls them, and where, is checked."""
    pinned, devices = [], []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: pinned.append(threading.current_thread().name) or t)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: devices.append((str(d), threading.current_thread().name)))
    settings = SimpleNamespace(batch_size=4, grad_accum=2, prefetch=2, max_steps=3)
    source = prefetch.batch_source(Counting(), settings, rank=1, world=2, device="cuda:1", start=1)
    try:
        taken = [source.take(s) for s in (1, 2)]
    finally:
        source.close()
    assert devices == [("cuda:1", THREAD_NAME)] and set(pinned) == {THREAD_NAME}
    assert [[int(x[0, 0]) for x, _ in micro] for micro in taken] == [[5, 7], [9, 11]]  # rank 1's sample of each micro
    assert not prefetch_threads()


def test_each_rank_and_micro_batch_draws_its_share_of_the_global_batch():
    for world, accum in ((1, 1), (2, 2), (4, 1)):
        got = sorted(
            i
            for rank in range(world)
            for first, count in prefetch.rank_slices(3, 8, accum, rank, world)
            for i in range(first, first + count)
        )
        assert got == list(range(24, 32))


def test_steps_are_taken_in_order_and_close_stops_a_waiting_thread():
    source = prefetch.Prefetcher(lambda s: s, start=0, stop=1000, depth=1)
    try:
        assert source.take(0) == 0
        with pytest.raises(RuntimeError, match="step 5 asked for, but step 1 is next"):
            source.take(5)
    finally:
        source.close()
    assert not prefetch_threads()


def test_prefetch_is_validated_and_may_change_on_resume():
    cfg = build.compose(["train.prefetch=-1"])
    with pytest.raises(ConfigError, match=r"^train.prefetch=-1: must be >= 0 \(0 = drawn in the training thread\)$"):
        check_schema(cfg)
    saved = {"config": {"train": {"prefetch": 2, "batch_size": 8}}}
    free = curve_free_keys(cfg)
    assert resume.differences(saved, {"config": {"train": {"prefetch": 0, "batch_size": 8}}}, free) == []
    assert (
        resume.differences(
            {"config": {"train": {"batch_size": 8}}}, {"config": {"train": {"prefetch": 2, "batch_size": 8}}}, free
        )
        == []
    )
