"""The training loop: plain objects in, metrics out to sinks; no Hydra, W&B or launcher here.

Its pieces: forward/backward over a step's micro-batches, the fixed-set evaluation, dropping a non-finite step and the
one-line reason a diverged run stops, a checkpoint at a step (single file or sharded), and the summary figures.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from gptlab.runtime import distributed
from gptlab.runtime.cpu_load import job_sampler
from gptlab.runtime.metrics import PeakMemory, median, mfu
from gptlab.state import checkpoint, resume, sharded
from gptlab.state.resume import Progress
from gptlab.train import diagnostics, prefetch
from gptlab.train.bundle import Bundle, Context
from gptlab.train.loss import training_loss
from gptlab.train.probes.score import measure_probes
from gptlab.train.signals import StopFlag

log = logging.getLogger(__name__)


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


class TrainingDiverged(RuntimeError):
    """The loss became NaN/inf more often than train.nan_skip allows."""


@torch.no_grad()
def evaluate(model, val_set, micro_bs: int, hardware, device) -> dict[str, float]:
    """Token-weighted mean loss (and answer accuracy) over the fixed validation set, in micro-batches of micro_bs.

    Weighting by scored tokens makes the figure independent of how the set is split into batches.
    """
    model.eval()
    x_all, y_all = val_set  # (N, T) each
    loss_sum, correct, counted = 0.0, 0, 0
    for i in range(0, len(x_all), micro_bs):
        x, y = x_all[i : i + micro_bs].to(device), y_all[i : i + micro_bs].to(device)
        with hardware.autocast():
            logits, loss = model(x, y)
        scored = y != -100
        n = int(scored.sum().item())
        loss_sum += loss.item() * n
        correct += (logits.argmax(-1)[scored] == y[scored]).sum().item()
        counted += n
    model.train()
    return {"val/loss": loss_sum / max(1, counted), "val/acc": correct / max(1, counted)}


def train_step(run: Bundle, batches: list, monitor=None) -> tuple[float, float, dict[str, float]]:
    """Forward/backward over this step's CPU micro-batches, unscale, clip; returns (cross-entropy, grad norm, extra
    loss terms by name), each averaged over the micro-batches (and ranks). No optimizer step."""
    model, forward_model, scaler, device = run.model, run.forward_model, run.scaler, run.hardware.device
    ce = torch.zeros((), device=device)
    extra: dict[str, torch.Tensor] = {}
    for i, (x, y) in enumerate(batches):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)  # pinned on CUDA: an async copy
        sync = i == len(batches) - 1 or not hasattr(forward_model, "no_sync")
        with forward_model.no_sync() if not sync else contextlib.nullcontext():  # all-reduce on the last only
            with run.hardware.autocast():
                loss = training_loss(forward_model, x, y)
            scaler.scale(loss.total / len(batches)).backward()
        ce += loss.cross_entropy.detach().float() / len(batches)
        for name, term in loss.extra.items():
            extra[name] = extra.get(name, torch.zeros((), device=device)) + term.detach().float() / len(batches)
    scaler.unscale_(run.optimizer)  # a no-op unless fp16: clipping sees the true gradients
    if monitor is not None:
        monitor.grads_ready()  # per-group norms before clipping (train.diagnostics / spike_factor)
    clip = run.settings.grad_clip if run.settings.grad_clip > 0 else float("inf")
    grad_norm = distributed.clip_grad_norm(model.parameters(), clip)  # the global norm, also over FSDP2 shards
    values = [ce.item(), *(float(v) for v in extra.values())]
    if run.ctx.world > 1:
        reduced = torch.tensor(values, device=device)
        torch.distributed.all_reduce(reduced)
        values = [v / run.ctx.world for v in reduced.tolist()]
    return values[0], grad_norm, {f"train/{name}": v for name, v in zip(extra, values[1:])}


def skip_step(optimizer, scaler, loss, grad_norm, p: Progress, settings, ctx) -> None:
    """A non-finite loss (or gradient, without an fp16 scaler): drop the step, or stop past train.nan_skip."""
    p.nan_seen += 1
    optimizer.zero_grad(set_to_none=True)
    if scaler.is_enabled():
        scaler.update()
    if p.nan_seen > settings.nan_skip:
        raise TrainingDiverged(diverged_message(loss, grad_norm, p.step, p.nan_seen, settings, ctx))
    log.warning(
        "step %d: loss %s, grad norm %s; skipped (%d of train.nan_skip=%d)",
        p.step,
        loss,
        grad_norm,
        p.nan_seen,
        settings.nan_skip,
    )
    p.step += 1


def diverged_message(loss, grad_norm, step, nan_seen, settings, ctx) -> str:
    """The one-line reason a run stops on a non-finite loss or gradient, with the checkpoint it keeps."""
    last = checkpoint.latest_path(ctx.run_dir)
    kept = f"last good checkpoint: {last}" if last else "no checkpoint was written yet"
    return (
        f"train: loss {loss}, grad norm {grad_norm} at step {step} ({nan_seen} non-finite steps, "
        f"train.nan_skip={settings.nan_skip}); {kept}; lower optimizer.lr or raise train.nan_skip"
    )


def summarise(p: Progress, status: str, ctx: Context) -> dict:
    """The run's summary figures, computed from its progress alone (so a resumed run reports the whole run)."""
    return {
        "final_val_loss": p.last_val_loss,
        "best_val_loss": p.best_val_loss if math.isfinite(p.best_val_loss) else None,
        "steps": p.step,
        "tokens": p.tokens,
        "tokens_per_s_median": median(p.tokens_per_s),
        "step_ms_median": median(p.step_ms),
        "data_ms_median": median(p.data_ms),
        "mfu_median": median(p.mfu) if ctx.peak_flops else None,
        "peak_mem_bytes": p.peak_mem_bytes,
        "wall_s": p.wall_s,
        "status": status,
        "outside_load": p.outside_ticks / p.total_ticks if p.total_ticks else None,
        **({"probe_s": p.probe_s, **p.last_probes} if p.last_probes else {}),  # the last eval's probe/* values
    }


def save_checkpoint(model, optimizer, scaler, p: Progress, ctx: Context) -> None:
    """Sharded: every rank writes its shards (collective). Single file: rank 0 writes, the others wait for it."""
    if ctx.sharded:
        sharded.save(
            ctx.run_dir,
            p.step,
            model,
            optimizer,
            resume.state_dict(model, optimizer, scaler, p, ctx.identity),
            ctx.rank,
            ctx.world,
        )
        return
    if ctx.is_main:
        checkpoint.save(ctx.run_dir, p.step, resume.state_dict(model, optimizer, scaler, p, ctx.identity))
    if ctx.world > 1:
        torch.distributed.barrier()


def train(
    run: Bundle, sinks: list, progress: Progress | None = None, resumed: bool = False, stop: StopFlag | None = None
) -> dict:
    """Train the built run from `progress` (resume.restore's result; None = step 0) to train.max_steps; returns the
    summary figures."""
    p = progress or Progress()
    own_stop, stop = stop is None, stop or StopFlag()  # a flag made here is taken down here
    # train.prefetch steps ahead
    source = prefetch.batch_source(run.data, run.settings, run.ctx.rank, run.ctx.world, run.hardware.device, p.step)
    try:
        return _Loop(run, sinks, p, resumed, stop, source).run()
    finally:
        source.close()  # whatever ended the loop: no batch thread outlives train()
        if own_stop:
            stop.restore()


@dataclass(eq=False)
class _Loop:
    """One call of train(): the built run it drives, its progress `p`, its clocks and its load sampler."""

    bundle: Bundle
    sinks: list
    p: Progress
    resumed: bool
    stop: StopFlag
    source: Any

    def __post_init__(self) -> None:
        settings, p = self.bundle.settings, self.p
        self.device = self.bundle.hardware.device
        self.peak = PeakMemory(
            self.device
        )  # this run's own peak: nothing carried over from earlier runs in the process
        for group in self.bundle.optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.start_step = p.step
        for sink in self.sinks:  # rows after the checkpoint are redone; from scratch, every row
            getattr(sink, "truncate_after", lambda s: None)(self.start_step if self.resumed else -1)
        self.micro_bs = settings.batch_size // settings.grad_accum // self.bundle.ctx.world
        self.val_set = self.bundle.data.val_samples(settings.eval_sequences)
        self.tokens_per_step = settings.batch_size * self.bundle.data.seq_len
        self.status, self.wall0, self.started = "finished", p.wall_s, time.perf_counter()
        # how busy the machine is besides this run
        self.load = job_sampler(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        self.monitor = diagnostics.Monitor(
            self.bundle.model, self.bundle.data, self.bundle.hardware, settings, self.bundle.ctx
        )

    def wall(self) -> float:
        return self.wall0 + time.perf_counter() - self.started

    def run(self) -> dict:
        self.bundle.model.train()
        while self._between_steps():
            self._step()
        _bank_load(self.load, self.p)
        return summarise(self.p, self.status, self.bundle.ctx)

    def _between_steps(self) -> bool:
        """Eval and checkpoint where due at the current step; False when the run ends here."""
        p, settings, ctx = self.p, self.bundle.settings, self.bundle.ctx
        if p.step == max(self.start_step, settings.speed_warmup):
            self.load.start()  # measured over the timed steps only
        if _eval_due(p.step, settings, self.start_step, self.resumed):
            ev = evaluate(self.bundle.model, self.val_set, self.micro_bs, self.bundle.hardware, self.device)
            p.last_val_loss, p.best_val_loss = ev["val/loss"], min(p.best_val_loss, ev["val/loss"])
            probed, probe_s = measure_probes(  # train.probes: their own fixed sets, no RNG drawn
                self.bundle.probes, self.bundle.model, self.bundle.hardware, self.micro_bs * self.bundle.data.seq_len
            )
            p.last_probes, p.probe_s = probed or p.last_probes, p.probe_s + probe_s
            row = {
                "val/loss": ev["val/loss"],
                **({"val/acc": ev["val/acc"]} if self.bundle.data.reports_accuracy else {}),
                **probed,
                **({"probe_ms": 1000 * probe_s} if probed else {}),
                "tokens": p.tokens,
                "wall_s": self.wall(),
                "flops": p.tokens * self.bundle.ctx.flops_per_token,  # cumulative training FLOPs (the MFU model's)
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
            save_checkpoint(self.bundle.model, self.bundle.optimizer, self.bundle.scaler, p, ctx)
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
        p, optimizer, scaler, monitor = self.p, self.bundle.optimizer, self.bundle.scaler, self.monitor
        factor = self.bundle.schedule(p.step)
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * factor
        t0 = time.perf_counter()
        batches = self.source.take(p.step)  # a skipped step is not redrawn: p.step moves on, as does the prefetcher
        data_s = time.perf_counter() - t0
        monitor.start(p.step)
        loss, grad_norm, terms = train_step(self.bundle, batches, monitor)
        if not math.isfinite(loss) or (not math.isfinite(grad_norm) and not scaler.is_enabled()):
            monitor.nonfinite(batches, p.step)
            skip_step(optimizer, scaler, loss, grad_norm, p, self.bundle.settings, self.bundle.ctx)
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
        self._record(loss, grad_norm, step_s, data_s, diag_s, extra, terms)

    def _record(
        self, loss: float, grad_norm: float, step_s: float, data_s: float, diag_s: float, extra: dict, terms: dict
    ):
        """The finished step's speed figures into the progress; its row to the sinks at log steps (or a spike's)."""
        p, settings, tokens_per_step = self.p, self.bundle.settings, self.tokens_per_step
        step_mfu = mfu(
            self.bundle.ctx.flops_per_token, tokens_per_step / step_s, self.bundle.ctx.peak_flops, self.bundle.ctx.world
        )
        if p.step > settings.speed_warmup:
            p.tokens_per_s.append(tokens_per_step / step_s)
            p.step_ms.append(step_s * 1000)
            p.data_ms.append(data_s * 1000)
            p.mfu.append(step_mfu or 0.0)
        if p.step % settings.log_interval == 0 or p.step == settings.max_steps:
            row = {
                "train/loss": loss,
                **terms,  # extra loss terms (train/<name>) beside the cross-entropy
                "lr": self.bundle.optimizer.param_groups[0]["lr"],
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
            _emit(self.sinks, self.bundle.ctx, row, p.step)
            self.load.sample()
        elif extra:  # a spike between log steps: its own row
            _emit(self.sinks, self.bundle.ctx, {**extra, "tokens": p.tokens, "wall_s": self.wall()}, p.step)


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
