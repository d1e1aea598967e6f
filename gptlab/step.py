"""The loop's pieces (gptlab/loop.py calls them): forward/backward over a step's micro-batches, the fixed-set
evaluation, dropping a non-finite step and the one-line reason a diverged run stops, a checkpoint at a step
(single file or sharded), and the summary figures computed from a run's progress."""

from __future__ import annotations

import contextlib
import logging
import math
from typing import TYPE_CHECKING

import torch

from gptlab import checkpoint, distributed, resume, sharded
from gptlab.metrics import median
from gptlab.resume import Progress

if TYPE_CHECKING:  # the loop imports this module
    from gptlab.loop import Context

log = logging.getLogger("gptlab.loop")  # the loop's messages keep one logger name ([gptlab.loop] in run.log)


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


def train_step(model, ddp_model, optimizer, scaler, batches, settings, hardware, ctx, device, monitor=None):
    """Forward/backward over this step's CPU micro-batches, unscale, clip; returns (loss, grad norm). No optimizer step."""
    total = 0.0
    for i, (x, y) in enumerate(batches):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)  # pinned on CUDA: an async copy
        sync = i == len(batches) - 1 or not hasattr(ddp_model, "no_sync")
        with ddp_model.no_sync() if not sync else contextlib.nullcontext():  # all-reduce on the last only
            with hardware.autocast():
                _, loss = ddp_model(x, y)
            scaler.scale(loss / len(batches)).backward()
        total += loss.detach().float() / len(batches)
    scaler.unscale_(optimizer)  # a no-op unless fp16: clipping sees the true gradients
    if monitor is not None:
        monitor.grads_ready()  # per-group norms before clipping (train.diagnostics / spike_factor)
    clip = settings.grad_clip if settings.grad_clip > 0 else float("inf")
    grad_norm = distributed.clip_grad_norm(model.parameters(), clip)  # the global norm, also over FSDP2 shards
    loss_value = total.item()
    if ctx.world > 1:
        loss_t = torch.tensor([loss_value], device=device)
        torch.distributed.all_reduce(loss_t)
        loss_value = loss_t.item() / ctx.world
    return loss_value, grad_norm


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
