"""No host sync in the hot loop: a step's loss, grad norm and times stay on the device until a log step, an eval, a
checkpoint or the end, where they are read back together; the rows are the same as when each step was read at once.

No GPU here: the CUDA timing events are replaced by a counting stand-in (record / synchronize / elapsed_time), and the
synchronising calls (Tensor.item / __float__ / __int__ / __bool__ / tolist, torch.cuda.synchronize) are counted on
the CPU run: on a GPU each of them would wait for the device.
"""

from __future__ import annotations

import math
import threading
import time

import pytest
import torch

from gptlab.errors import TrainingDiverged
from gptlab.runtime import metrics
from gptlab.state import checkpoint
from gptlab.train import loop
from helpers.train import rows, run_inprocess

CURVE = ("train/loss", "train/grad_norm", "train/lr", "tokens", "val/loss")
SYNCING = ("item", "__float__", "__int__", "__bool__", "tolist")


def curve(run_dir) -> dict[int, dict]:
    """{step: the row's deterministic figures} (times and memory left out)."""
    out: dict[int, dict] = {}
    for r in rows(run_dir):
        out.setdefault(r["step"], {}).update({k: r[k] for k in CURVE if k in r})
    return out


def test_rows_are_the_same_read_each_step_or_at_log_steps(tmp_path):
    """train.nan_skip=1 reads each step at once (the per-step path); log_interval 1 and 4 read in batches."""
    each = curve_of(tmp_path / "each", "train.nan_skip=1")
    every = curve_of(tmp_path / "every", "train.log_interval=1")
    batched = curve_of(tmp_path / "batched", "train.log_interval=4")
    assert each == every  # bit-identical floats: the same values, read at another time
    assert sorted(batched) == [0, 4, 5, 8, 10]  # train rows at 4, 8, 10; val rows at 0, 5, 10
    assert all(batched[s] == {k: every[s][k] for k in batched[s]} for s in batched)
    assert all(set(CURVE) - {"val/loss"} <= set(batched[s]) for s in (4, 8, 10))
    assert all(set(CURVE) - {"val/loss"} <= set(every[s]) for s in range(1, 11))


def curve_of(run_dir, *overrides):
    run_inprocess(run_dir, *overrides, steps=10, eval_interval=5)
    return curve(run_dir)


class FakeEvent:
    """torch.cuda.Event without a GPU: record() notes the CPU time; synchronize and elapsed_time are counted."""

    calls: list[str] = []

    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        self.t: float | None = None

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        FakeEvent.calls.append("Event.synchronize")

    def elapsed_time(self, other: FakeEvent) -> float:
        FakeEvent.calls.append("Event.elapsed_time")
        assert self.t is not None and other.t is not None
        return (other.t - self.t) * 1000


def test_no_synchronising_call_in_a_step_that_is_not_logged(tmp_path, monkeypatch):
    calls: list[str] = []
    main = threading.main_thread()

    def counting(name, real):
        def wrapper(*args, **kwargs):
            if threading.current_thread() is main:
                calls.append(name)
            return real(*args, **kwargs)

        return wrapper

    for name in SYNCING:
        monkeypatch.setattr(torch.Tensor, name, counting(f"Tensor.{name}", getattr(torch.Tensor, name)))
    monkeypatch.setattr(torch.cuda, "synchronize", counting("cuda.synchronize", lambda *a, **k: None))
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    FakeEvent.calls = calls
    monkeypatch.setattr(loop, "StepClock", lambda device: metrics.StepClock("cuda"))  # the CUDA clock, faked events
    per_step: dict[int, list[str]] = {}
    real_step = loop._Loop._step

    def step(self):
        before = len(calls)
        real_step(self)
        per_step[self.p.step] = calls[before:]

    monkeypatch.setattr(loop._Loop, "_step", step)
    summary = run_inprocess(tmp_path, "train.log_interval=4", steps=10, eval_interval=5)
    assert sorted(per_step) == list(range(1, 11))
    logged = {4, 8, 10}
    assert {s: c for s, c in per_step.items() if s not in logged and c} == {}  # 0 per non-log step
    for s in logged:  # one batch read (the figures' tolist) and one wait for the last timing event
        assert per_step[s].count("Tensor.tolist") == 1 and per_step[s].count("Event.synchronize") == 1
    assert summary["steps"] == 10 and summary["step_ms_median"] > 0
    times = [r["perf/step_ms"] for r in rows(tmp_path) if "perf/step_ms" in r]
    assert len(times) == 3 and all(t > 0 for t in times)


def test_a_nan_found_at_a_log_step_names_its_step_and_never_reaches_a_checkpoint(tmp_path, monkeypatch):
    """SGD at lr 30 without clipping diverges; read every step (log_interval 1) the run stops at the first
    non-finite step K; read every 4 steps it trains at most 3 more steps after K, stops naming K with the same figures,
    and no checkpoint past K is written (each checkpoint, every 3 steps, first reads back the steps before it)."""
    diverge = ("optimizer=sgd", "optimizer.lr=30", "train.grad_clip=0")
    with pytest.raises(TrainingDiverged) as each:
        run_inprocess(tmp_path / "each", *diverge, "train.log_interval=1", steps=30, eval_interval=30)
    reached: list[int] = []
    real_step = loop._Loop._step
    monkeypatch.setattr(loop._Loop, "_step", lambda self: real_step(self) or reached.append(self.p.step))
    run = tmp_path / "batched"
    with pytest.raises(TrainingDiverged) as batched:
        run_inprocess(run, *diverge, "train.log_interval=4", "train.ckpt_interval=3", steps=30, eval_interval=30)
    head = str(each.value).split(");")[0]
    bad = int(head.split(" at step ")[1].split()[0])  # numbered as its row would be (1 = the first update)
    assert str(batched.value).startswith(head)  # same step, loss and grad norm, "1 non-finite steps"
    assert bad <= max(reached) <= bad + 3  # step `bad` and up to 3 more before a read found it
    saved = sorted(checkpoint.ckpt_dir(run).glob("step_*.pt"))
    assert saved and all(checkpoint.load(p)["step"] < bad for p in saved)
    for p in saved:
        assert all(torch.isfinite(t).all() for t in checkpoint.load(p)["model"].values())
    assert f"last good checkpoint: {saved[-1]}" in str(batched.value)
    train_rows = [r for r in rows(run) if "train/loss" in r]
    assert train_rows and all(math.isfinite(r["train/loss"]) and r["step"] < bad for r in train_rows)
