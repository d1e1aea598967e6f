"""The training loop: plain objects in, metrics out to sinks; no Hydra, W&B or launcher here."""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gptlab import diagnostics, prefetch
from gptlab.load import job_sampler
from gptlab.metrics import PeakMemory, mfu
from gptlab.resume import Progress
from gptlab.signals import StopFlag  # noqa: F401  (imported from here by the CLI and tests)
from gptlab.step import evaluate, save_checkpoint, skip_step, summarise, train_step

log = logging.getLogger(__name__)


@dataclass
class Context:
    """Where and as whom the loop runs: run dir, rank/world, MFU inputs, the run identity checkpoints carry, and
    whether checkpoints are sharded (DCP dirs every rank writes: hardware.strategy=fsdp) or one file rank 0 writes."""

    run_dir: Path
    flops_per_token: float
    peak_flops: float | None
    identity: dict = field(default_factory=dict)
    rank: int = 0
    world: int = 1
    sharded: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _agree(flag: bool, ctx: Context, device: str) -> bool:
    """True on every rank if it is True on any, so all ranks stop at the same step."""
    if ctx.world == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return bool(t.item())


def _eval_due(step: int, settings, start_step: int, resumed: bool) -> bool:
    """At 0, N, 2N, ..., the last step and the first step of a run; a resume already logged its start step's row."""
    if step == start_step:
        return not resumed
    return step % settings.eval_interval == 0 or step == settings.max_steps


def train(
    model,
    data,
    optimizer,
    schedule,
    hardware,
    settings,
    sinks,
    ctx: Context,
    ddp_model=None,
    progress: Progress | None = None,
    resumed: bool = False,
    scaler=None,
    stop: StopFlag | None = None,
) -> dict:
    """Train from `progress` (resume.restore's result; None = step 0) to settings.max_steps; returns the summary."""
    device = hardware.device
    ddp_model = model if ddp_model is None else ddp_model  # not `or`: a compiled module raises on bool()
    p = progress or Progress()
    scaler = scaler or torch.amp.GradScaler(device.split(":")[0], enabled=False)
    own_stop, stop = stop is None, stop or StopFlag()  # a flag made here is taken down here
    source = prefetch.batch_source(data, settings, ctx.rank, ctx.world, device, p.step)  # train.prefetch steps ahead
    try:
        return _Loop(
            model,
            ddp_model,
            data,
            optimizer,
            schedule,
            hardware,
            settings,
            sinks,
            ctx,
            p,
            resumed,
            scaler,
            stop,
            source,
        ).run()
    finally:
        source.close()  # whatever ended the loop: no batch thread outlives train()
        if own_stop:
            stop.restore()


@dataclass(eq=False)
class _Loop:
    """One call of train(): the objects it drives, its progress `p`, its clocks and its load sampler."""

    model: Any
    ddp_model: Any
    data: Any
    optimizer: Any
    schedule: Any
    hardware: Any
    settings: Any
    sinks: list
    ctx: Context
    p: Progress
    resumed: bool
    scaler: Any
    stop: StopFlag
    source: Any

    def __post_init__(self) -> None:
        settings, p = self.settings, self.p
        self.device = self.hardware.device
        self.peak = PeakMemory(
            self.device
        )  # this run's own peak: nothing carried over from earlier runs in the process
        for group in self.optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.start_step = p.step
        for sink in self.sinks:  # rows after the checkpoint are redone; from scratch, every row
            getattr(sink, "truncate_after", lambda s: None)(self.start_step if self.resumed else -1)
        self.micro_bs = settings.batch_size // settings.grad_accum // self.ctx.world
        self.val_set = self.data.val_samples(settings.eval_sequences)
        self.tokens_per_step = settings.batch_size * self.data.seq_len
        self.status, self.wall0, self.started = "finished", p.wall_s, time.perf_counter()
        # how busy the machine is besides this run
        self.load = job_sampler(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        self.monitor = diagnostics.Monitor(self.model, self.data, self.hardware, settings, self.ctx)

    def wall(self) -> float:
        return self.wall0 + time.perf_counter() - self.started

    def run(self) -> dict:
        self.model.train()
        while self._between_steps():
            self._step()
        _bank_load(self.load, self.p)
        return summarise(self.p, self.status, self.ctx)

    def _between_steps(self) -> bool:
        """Eval and checkpoint where due at the current step; False when the run ends here."""
        p, settings, ctx = self.p, self.settings, self.ctx
        if p.step == max(self.start_step, settings.speed_warmup):
            self.load.start()  # measured over the timed steps only
        if _eval_due(p.step, settings, self.start_step, self.resumed):
            ev = evaluate(self.model, self.val_set, self.micro_bs, self.hardware, self.device)
            p.last_val_loss, p.best_val_loss = ev["val/loss"], min(p.best_val_loss, ev["val/loss"])
            row = {
                "val/loss": ev["val/loss"],
                **({"val/acc": ev["val/acc"]} if self.data.reports_accuracy else {}),
                "tokens": p.tokens,
                "wall_s": self.wall(),
            }  # every row has all x-axes
            _emit(self.sinks, ctx, row, p.step)
        stopping = _agree(self.stop.signum is not None, ctx, self.device)
        if p.step != self.start_step:  # a resumed run that trains nothing keeps its figures as they were
            p.wall_s = self.wall()
            p.peak_mem_bytes = max(p.peak_mem_bytes, self.peak.read())
        # checkpoint after this step's eval row is written, so a resume never re-logs or loses a row
        ckpt_due = settings.ckpt_interval and p.step % settings.ckpt_interval == 0
        if (ckpt_due or p.step >= settings.max_steps or stopping) and p.step != self.start_step:
            _bank_load(self.load, p)
            save_checkpoint(self.model, self.optimizer, self.scaler, p, ctx)
        if p.step >= settings.max_steps:
            return False
        if stopping:
            self.status = self.stop.status if self.stop.signum is not None else "preempted"  # another rank's signal
            return False
        return True

    def _step(self) -> None:
        """One optimizer step (or a skipped non-finite one) and its metrics.

        Step time: waiting for this step's batches (data_ms) + moving them + forward/backward + optimizer step
        (+ a CUDA sync); eval, checkpoints and the diagnostics' own time fall outside it.
        """
        p, optimizer, scaler, monitor = self.p, self.optimizer, self.scaler, self.monitor
        factor = self.schedule(p.step)
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * factor
        t0 = time.perf_counter()
        batches = self.source.take(p.step)  # a skipped step is not redrawn: p.step moves on, as does the prefetcher
        data_s = time.perf_counter() - t0
        monitor.start(p.step)
        loss, grad_norm = train_step(
            self.model,
            self.ddp_model,
            optimizer,
            scaler,
            batches,
            self.settings,
            self.hardware,
            self.ctx,
            self.device,
            monitor,
        )
        if not math.isfinite(loss) or (not math.isfinite(grad_norm) and not scaler.is_enabled()):
            monitor.nonfinite(batches, p.step)
            skip_step(optimizer, scaler, loss, grad_norm, p, self.settings, self.ctx)
            return
        monitor.before_update()
        scaler.step(optimizer)  # fp16: skipped when the scaled gradients overflowed (the scale then shrinks)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        extra = monitor.after_update(p.step, loss, batches)
        diag_s = monitor.take_spent()  # the diagnostics' own time: not the step's, reported as diag_ms
        step_s = time.perf_counter() - t0 - diag_s
        p.step += 1
        p.tokens += self.tokens_per_step
        self._record(loss, grad_norm, step_s, data_s, diag_s, extra)

    def _record(self, loss: float, grad_norm: float, step_s: float, data_s: float, diag_s: float, extra: dict):
        """The finished step's speed figures into the progress; its row to the sinks at log steps (or a spike's)."""
        p, settings, tokens_per_step = self.p, self.settings, self.tokens_per_step
        step_mfu = mfu(self.ctx.flops_per_token, tokens_per_step / step_s, self.ctx.peak_flops, self.ctx.world)
        if p.step > settings.speed_warmup:
            p.tokens_per_s.append(tokens_per_step / step_s)
            p.step_ms.append(step_s * 1000)
            p.data_ms.append(data_s * 1000)
            p.mfu.append(step_mfu or 0.0)
        if p.step % settings.log_interval == 0 or p.step == settings.max_steps:
            row = {
                "train/loss": loss,
                "lr": self.optimizer.param_groups[0]["lr"],
                "grad_norm": grad_norm,
                "tokens": p.tokens,
                "tokens_per_s": tokens_per_step / step_s,
                "step_ms": step_s * 1000,
                "data_ms": data_s * 1000,
                "mfu": step_mfu,
                "peak_mem_bytes": max(p.peak_mem_bytes, self.peak.read()),
                "wall_s": self.wall(),
                **extra,
                **({"diag_ms": diag_s * 1000} if self.monitor.diag is not None else {}),
            }
            _emit(self.sinks, self.ctx, row, p.step)
            self.load.sample()
        elif extra:  # a spike between log steps: its own row
            _emit(self.sinks, self.ctx, {**extra, "tokens": p.tokens, "wall_s": self.wall()}, p.step)


def _bank_load(load, p: Progress) -> None:
    """Move the sampler's closed intervals into the progress (so a resume keeps the whole run's outside load)."""
    load.sample(force=True)
    p.outside_ticks += load.outside_ticks
    p.total_ticks += load.total_ticks
    load.outside_ticks = load.total_ticks = load.own_ticks = 0


def _emit(sinks, ctx, row, step):
    if ctx.is_main:
        for sink in sinks:
            sink.log(row, step)
