"""Measured time per module kind over a few training steps (torch.profiler trace + module hooks).

`profile_steps` runs a few full steps (forward, backward, optimizer) of a GPT honouring the
gptlab.model contract, times each module kind with forward/backward hooks (exclusive of nested
hooked modules, so nothing is counted twice), per layer (block index) as well, labels the same
regions with record_function in a Chrome trace, and restores the model, optimizer and RNG afterwards
so a run's curve is unchanged. Tables: gptlab.train.profile.table; hooks and timer: gptlab.train.profile.hooks.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from gptlab.costs.ops import GROUPS
from gptlab.train.loss import training_loss
from gptlab.train.profile.hooks import Timer, hook_modules
from gptlab.train.profile.state import restore_state, snapshot_state


@dataclass
class ProfileResult:
    """Mean seconds per step by module kind and by layer, the measured step time, and the cost model's shares."""

    step_s: float
    seconds: dict
    predicted_share: dict = field(default_factory=dict)
    trace_path: str | None = None
    layers: list = field(default_factory=list)  # per block index: {kind: seconds per step}
    predicted_layers: list | None = None  # per block index: predicted share of the step

    @property
    def attributed_s(self) -> float:
        return sum(self.seconds.values())

    def outside_layers(self) -> dict:
        """Seconds per kind spent outside every block (embedding, final norm, head, loss, backward glue, optimizer)."""
        return {k: v - sum(layer[k] for layer in self.layers) for k, v in self.seconds.items()}

    def layer_rows(self) -> list[dict]:
        """One row per layer: seconds per kind, total, measured share of the step, predicted share (or None)."""
        rows = []
        for i, kinds in enumerate(self.layers):
            total = sum(kinds.values())
            pred = self.predicted_layers[i] if self.predicted_layers else None
            rows.append(
                {
                    "layer": i,
                    "seconds": dict(kinds),
                    "total_s": total,
                    "measured_share": total / self.step_s,
                    "predicted_share": pred,
                }
            )
        return rows

    def to_dict(self) -> dict:
        share = {k: v / self.step_s for k, v in self.seconds.items()}
        return {
            "step_s": self.step_s,
            "attributed_s": self.attributed_s,
            "seconds": self.seconds,
            "measured_share": share,
            "predicted_share": self.predicted_share,
            "trace_path": self.trace_path,
            "layers": self.layer_rows(),
            "outside_layers_s": self.outside_layers(),
        }


def predicted_shares(report) -> dict:
    """Share of the cost model's step time lower bound per module kind (from a train-mode CostReport)."""
    rows = report["ops"] if isinstance(report, dict) else report.ops
    total = sum(r["time_lower_bound_s"] for r in rows) or 1.0
    share = dict.fromkeys(GROUPS, 0.0)
    for r in rows:
        share[r["group"]] += r["time_lower_bound_s"] / total
    return share


def predicted_layer_shares(report, model: nn.Module) -> list[float]:
    """Share of the cost model's step time lower bound per layer (block index), same report as predicted_shares."""
    from gptlab.costs.report import layer_times

    d = report if isinstance(report, dict) else report.to_dict()
    total = sum(r["time_lower_bound_s"] for r in d["ops"]) or 1.0
    return [t / total for t in layer_times(model, d)]


def _plain_step(model, optimizer, batch, autocast) -> None:
    with autocast():
        loss = training_loss(model, *batch).total  # (x, y) or (x, y, document ids)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _timed_step(model, optimizer, batch, autocast, timer: Timer) -> None:
    """forward (hooked) + backward (time outside module hooks -> "other") + optimizer step and zero_grad."""
    with autocast():
        loss = training_loss(model, *batch).total  # (x, y) or (x, y, document ids)
    before = sum(timer.seconds.values())
    timer.sync()
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Full backward hook is firing")  # embeddings: int inputs
        loss.backward()
    timer.close_all()  # in case a post-hook did not fire
    backward_s = time.perf_counter() - t0
    timer.seconds["other"] += backward_s - (sum(timer.seconds.values()) - before)  # loss, grad accumulation
    t0 = time.perf_counter()
    with torch.profiler.record_function("optimizer:step"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    timer.sync()
    timer.seconds["optimizer"] += time.perf_counter() - t0


def _timed(model, optimizer, xy: tuple[torch.Tensor, ...], autocast, timer: Timer, sync) -> float:
    """One hooked training step on batch xy; its wall time in seconds (synchronised on CUDA)."""
    sync()
    t0 = time.perf_counter()
    _timed_step(model, optimizer, xy, autocast, timer)
    sync()
    return time.perf_counter() - t0


def profile_steps(
    model: Any,
    optimizer,
    batch: Callable[[int], tuple[torch.Tensor, ...]],
    *,
    steps: int = 3,
    warmup: int = 1,
    autocast: Callable = contextlib.nullcontext,
    device: str = "cpu",
    run_dir: str | Path | None = None,
    predicted: dict | None = None,
    restore: bool = True,
    predicted_layers: list[float] | None = None,
) -> ProfileResult:
    """Profile `steps` training steps (after `warmup` unprofiled ones); batch(i) -> (x, y[, document ids]) on `device`.

    `predicted` (per kind) and `predicted_layers` (per block index) are the cost model's shares to print alongside.

    Writes `profile_trace.json` (Chrome trace) and `profile.json` into run_dir when given.
    """
    saved = snapshot_state(model, optimizer) if restore else None
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    was_training = model.training
    model.train()
    timer, handles = Timer(sync, len(model.blocks)), []
    activities = [torch.profiler.ProfilerActivity.CPU]
    if str(device).startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    try:
        # eager even when the model is compiled in place (hardware.compile): the hooks time each module's own forward
        with torch.compiler.set_stance("force_eager"):
            for i in range(warmup):
                _plain_step(model, optimizer, batch(i), autocast)
            handles = hook_modules(model, timer)
            with torch.profiler.profile(activities=activities) as prof:
                step_times = [
                    _timed(model, optimizer, batch(i), autocast, timer, sync) for i in range(warmup, warmup + steps)
                ]
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
        if saved is not None:
            restore_state(model, optimizer, saved)
            del saved
            if str(device).startswith("cuda"):
                torch.cuda.empty_cache()  # the profiled steps' activations and gradients, back to the driver
    result = ProfileResult(
        step_s=statistics.fmean(step_times),
        seconds={k: v / steps for k, v in timer.seconds.items()},
        predicted_share=dict(predicted or {}),
        layers=[{k: v / steps for k, v in layer.items()} for layer in timer.layers],
        predicted_layers=None if predicted_layers is None else list(predicted_layers),
    )
    if run_dir is not None:
        run_dir = Path(run_dir)
        prof.export_chrome_trace(str(run_dir / "profile_trace.json"))
        result.trace_path = str(run_dir / "profile_trace.json")
        (run_dir / "profile.json").write_text(json.dumps(result.to_dict(), indent=2))
    return result
