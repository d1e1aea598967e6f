"""The training loop: plain objects in, metrics out to sinks; no Hydra, W&B or launcher here."""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from gptlab import checkpoint
from gptlab.errors import ConfigError
from gptlab.metrics import median, mfu, peak_memory_bytes

log = logging.getLogger(__name__)


class TrainingDiverged(RuntimeError):
    """The loss became NaN/inf more often than train.nan_skip allows."""


@dataclass
class Context:
    """Where and as whom the loop runs: run dir, DDP rank/world, MFU inputs, checkpoint signature."""

    run_dir: Path
    flops_per_token: float
    peak_flops: float | None
    signature: dict = field(default_factory=dict)
    rank: int = 0
    world: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


class StopFlag:
    """Set by SIGTERM/SIGUSR1 (what SLURM sends before a time limit or pre-emption)."""

    def __init__(self):
        self.signum = None
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            try:
                signal.signal(sig, self._set)
            except ValueError:  # not the main thread (e.g. some launchers)
                pass

    def _set(self, signum, frame):
        self.signum = signum


@torch.no_grad()
def evaluate(model, val_batches, hardware, device) -> dict[str, float]:
    """Mean loss (and answer accuracy where targets are sparse) over the fixed validation batches."""
    model.eval()
    losses, correct, counted = [], 0, 0
    for x, y in val_batches:
        x, y = x.to(device), y.to(device)
        with hardware.autocast():
            logits, loss = model(x, y)
        losses.append(loss.item())
        scored = y != -100
        correct += (logits.argmax(-1)[scored] == y[scored]).sum().item()
        counted += scored.sum().item()
    model.train()
    return {"val/loss": sum(losses) / len(losses), "val/acc": correct / max(1, counted)}


def _state(model, optimizer, step, tokens, best, last_val, ctx) -> dict:
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "tokens": tokens,
            "best_val_loss": best, "last_val_loss": last_val, "torch_rng": torch.get_rng_state(),
            "signature": ctx.signature}


def load_resume(settings, ctx) -> tuple[dict, str] | None:
    """(state, source) of the checkpoint train.resume points at, checked against ctx.signature; None = start fresh.

    Called before any run file is written, so a refused checkpoint leaves the run dir untouched.
    """
    if settings.resume == "never":
        return None
    if settings.resume == "auto":
        state, source = checkpoint.load_latest(ctx.run_dir), "in the run dir"
        if state is None:
            return None
    else:
        state, source = checkpoint.load(Path(settings.resume)), f"'{settings.resume}'"
    checkpoint.check_compatible(state.get("signature", {}), ctx.signature, source)
    return state, source


def _resume(model, optimizer, resumed) -> tuple[int, int, float, float | None]:
    """Restore a checkpoint from load_resume; returns (step, tokens, best and last val loss)."""
    if resumed is None:
        return 0, 0, math.inf, None
    state, source = resumed
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        out = int(state["step"]), int(state["tokens"]), float(state["best_val_loss"]), state.get("last_val_loss")
    except (KeyError, RuntimeError, ValueError, TypeError) as err:
        first = " ".join(str(err).split())[:160]
        raise ConfigError(f"train.resume: checkpoint {source} does not fit this model ({type(err).__name__}: {first})") from None
    log.info("resumed from step %d (%s)", out[0], source)
    return out


def _micro_batches(data, step, settings, ctx, device):
    """This rank's rows of each micro-batch; the global batch does not depend on the world size."""
    micro_bs = settings.batch_size // settings.grad_accum
    for micro in range(settings.grad_accum):
        x, y = data.train_batch(step, micro, micro_bs)  # (micro_bs, T), pure function of the step
        yield x[ctx.rank::ctx.world].to(device), y[ctx.rank::ctx.world].to(device)


def _train_step(model, ddp_model, optimizer, data, step, settings, hardware, ctx, device) -> tuple[float, float]:
    """One optimizer step over grad_accum micro-batches; returns (loss, grad norm)."""
    total = 0.0
    batches = list(_micro_batches(data, step, settings, ctx, device))
    for i, (x, y) in enumerate(batches):
        sync = i == len(batches) - 1 or not hasattr(ddp_model, "no_sync")
        with ddp_model.no_sync() if not sync else contextlib.nullcontext():  # all-reduce on the last only
            with hardware.autocast():
                _, loss = ddp_model(x, y)
            (loss / len(batches)).backward()
        total += loss.detach().float() / len(batches)
    clip = settings.grad_clip if settings.grad_clip > 0 else float("inf")
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), clip)
    loss_value = total.item()
    if ctx.world > 1:
        loss_t = torch.tensor([loss_value], device=device)
        torch.distributed.all_reduce(loss_t)
        loss_value = loss_t.item() / ctx.world
    return loss_value, float(grad_norm)


def train(model, data, optimizer, schedule, hardware, settings, sinks, ctx: Context, ddp_model=None,
          resumed: tuple[dict, str] | None = None) -> dict:
    """Train to settings.max_steps from `resumed` (load_resume's result; None = step 0), log, checkpoint; returns the summary."""
    device = hardware.device
    ddp_model = model if ddp_model is None else ddp_model  # not `or`: a compiled module raises on bool()
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
    step, tokens, best, last_val = _resume(model, optimizer, resumed)
    resumed_at = step if step > 0 else None  # its eval row and checkpoint already exist
    for sink in sinks:  # rows after the checkpoint are redone; from scratch, the step-0 eval row too
        getattr(sink, "truncate_after", lambda s: None)(step if resumed_at else -1)
    val_batches = data.val_batches(settings.eval_batches, settings.batch_size // settings.grad_accum)
    tokens_per_step = settings.batch_size * data.seq_len
    stop, nan_seen, speeds, times, mfus = StopFlag(), 0, [], [], []
    status, started = "finished", time.perf_counter()
    model.train()
    while True:
        if (step % settings.eval_interval == 0 or step == settings.max_steps) and step != resumed_at:
            ev = evaluate(model, val_batches, hardware, device)
            last_val, best = ev["val/loss"], min(best, ev["val/loss"])
            row = {"val/loss": ev["val/loss"], **({"val/acc": ev["val/acc"]} if data.reports_accuracy else {})}
            _emit(sinks, ctx, row, step)
        # checkpoint after this step's eval row is written, so a resume never re-logs or loses a row
        ckpt_due = settings.ckpt_interval and step % settings.ckpt_interval == 0
        if (ckpt_due or step >= settings.max_steps or stop.signum is not None) and step not in (0, resumed_at):
            _save(model, optimizer, step, tokens, best, last_val, ctx)
        if step >= settings.max_steps:
            break
        if stop.signum is not None:
            status = "preempted"
            break
        factor = schedule(step)
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * factor
        t0 = time.perf_counter()
        loss, grad_norm = _train_step(model, ddp_model, optimizer, data, step, settings, hardware, ctx, device)
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            nan_seen += 1
            optimizer.zero_grad(set_to_none=True)
            if nan_seen > settings.nan_skip:
                raise TrainingDiverged(_diverged(loss, grad_norm, step, nan_seen, settings, ctx))
            log.warning("step %d: loss %s, grad norm %s; skipped (%d of train.nan_skip=%d)",
                        step, loss, grad_norm, nan_seen, settings.nan_skip)
            step += 1
            continue
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        step_s = time.perf_counter() - t0
        step += 1
        tokens += tokens_per_step
        if step > settings.speed_warmup:
            speeds.append(tokens_per_step / step_s)
            times.append(step_s * 1000)
            mfus.append(mfu(ctx.flops_per_token, tokens_per_step / step_s, ctx.peak_flops) or 0.0)
        if step % settings.log_interval == 0 or step == settings.max_steps:
            row = {"train/loss": loss, "lr": optimizer.param_groups[0]["lr"], "grad_norm": grad_norm,
                   "tokens": tokens, "tokens_per_s": tokens_per_step / step_s, "step_ms": step_s * 1000,
                   "mfu": mfu(ctx.flops_per_token, tokens_per_step / step_s, ctx.peak_flops),
                   "peak_mem_bytes": peak_memory_bytes(device), "wall_s": time.perf_counter() - started}
            _emit(sinks, ctx, row, step)
    summary = {"final_val_loss": last_val, "best_val_loss": best if math.isfinite(best) else None,
               "steps": step, "tokens": tokens, "tokens_per_s_median": median(speeds),
               "step_ms_median": median(times), "mfu_median": median(mfus) if ctx.peak_flops else None,
               "peak_mem_bytes": peak_memory_bytes(device), "wall_s": time.perf_counter() - started,
               "status": status}
    return summary


def _diverged(loss, grad_norm, step, nan_seen, settings, ctx) -> str:
    """The one-line reason a run stops on a non-finite loss or gradient, with the checkpoint it keeps."""
    last = checkpoint.latest_path(ctx.run_dir)
    kept = f"last good checkpoint: {last}" if last else "no checkpoint was written yet"
    return (f"train: loss {loss}, grad norm {grad_norm} at step {step} ({nan_seen} non-finite steps, "
            f"train.nan_skip={settings.nan_skip}); {kept}; lower optimizer.lr or raise train.nan_skip")


def _emit(sinks, ctx, row, step):
    if ctx.is_main:
        for sink in sinks:
            sink.log(row, step)


def _save(model, optimizer, step, tokens, best, last_val, ctx):
    """Rank 0 writes; other ranks wait so nobody races ahead of a checkpoint."""
    if ctx.is_main:
        checkpoint.save(ctx.run_dir, step, _state(model, optimizer, step, tokens, best, last_val, ctx))
    if ctx.world > 1:
        torch.distributed.barrier()
