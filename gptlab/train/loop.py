"""The training loop: plain objects in, metrics out to sinks; no Hydra, W&B or launcher here.

Its pieces: forward/backward over a step's micro-batches, the fixed-set evaluation, dropping a non-finite step and the
one-line reason a diverged run stops, a checkpoint at a step (single file or sharded), and the summary figures.

No host sync in the hot loop: a step's loss, grad norm and extra terms stay on the device, and its times are marks
(CUDA events on a GPU); they are read together, once, at the next sync point: a log step, an eval, a checkpoint, a stop
or the end of the run. That is where a non-finite step is found, so a NaN may train up to train.log_interval - 1 further
steps before the run stops, and a checkpoint is only written after every step before it was read back finite.
train.nan_skip > 0, train.detect_anomaly and train.spike_factor read each step at once instead (one sync per step): a
step can only be dropped, replayed or flagged before the next one runs.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from gptlab.errors import TrainingDiverged
from gptlab.runtime import distributed
from gptlab.runtime.cpu_load import job_sampler
from gptlab.runtime.metrics import PeakMemory, StepClock, median, mfu
from gptlab.state import checkpoint, resume, sharded
from gptlab.state.resume import Progress
from gptlab.train import diagnostics, prefetch
from gptlab.train.bundle import Bundle, Context
from gptlab.train.loss import training_loss
from gptlab.train.probes.score import measure_probes
from gptlab.train.signals import StopFlag

log = logging.getLogger(__name__)


def _agree(flag: bool, ctx: Context, group) -> bool:
    """True on every rank if it is True on any, so all ranks stop at the same step; a CPU tensor over `group` (gloo),
    so the answer never waits for a GPU."""
    if ctx.world == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0])
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=group)
    return bool(t.item())


def checks_each_step(settings) -> bool:
    """Whether each step's figures are read at once (one host sync per step): a step can only be dropped
    (train.nan_skip), replayed (train.detect_anomaly) or flagged as a spike (train.spike_factor) before the next runs."""
    return bool(settings.nan_skip > 0 or settings.detect_anomaly or settings.spike_factor)


def _eval_due(p: Progress, settings, start_step: int, resumed: bool, planned: frozenset[int] = frozenset()) -> bool:
    """At 0, N, 2N, ..., the last step, the `planned` steps and the first step of a run. A resume already logged its
    start step's row, if that step had one: a resume that ends where it starts evaluates there unless its
    checkpoint's step was evaluated (else its final val loss would be an earlier step's)."""
    if p.step == start_step:
        return not resumed or (p.step >= settings.max_steps and p.last_val_step != p.step)
    return p.step % settings.eval_interval == 0 or p.step == settings.max_steps or p.step in planned


def flops_eval_steps(eval_flops: list[float] | None, flops_per_step: float, max_steps: int) -> frozenset[int]:
    """The steps around each cumulative-FLOPs value of train.eval_flops (the last step at or below it and the first
    at or above it), within [1, max_steps]: evals a step apart, so a reading at that FLOPs value is all but measured."""
    if not eval_flops or not flops_per_step > 0:
        return frozenset()
    steps = {f(x / flops_per_step) for x in eval_flops for f in (math.floor, math.ceil)}
    return frozenset(s for s in steps if 1 <= s <= max_steps)


@torch.no_grad()
def evaluate(model, val_set, micro_bs: int, hardware, device) -> dict[str, float]:
    """Token-weighted mean loss (and answer accuracy) over the fixed validation set, in micro-batches of micro_bs.

    Weighting by scored tokens makes the figure independent of how the set is split into batches.
    """
    model.eval()
    x_all, y_all, *docs_all = val_set  # (N, T) each; + (N, T) document ids with data.doc_mask
    loss_sum, correct, counted = 0.0, 0, 0
    for i in range(0, len(x_all), micro_bs):
        x, y = x_all[i : i + micro_bs].to(device), y_all[i : i + micro_bs].to(device)
        with hardware.autocast():
            if docs_all:
                logits, loss = model(x, y, docs=docs_all[0][i : i + micro_bs].to(device))
            else:
                logits, loss = model(x, y)
        scored = y != -100
        n = int(scored.sum().item())
        loss_sum += loss.item() * n
        correct += (logits.argmax(-1)[scored] == y[scored]).sum().item()
        counted += n
    model.train()
    return {"val/loss": loss_sum / max(1, counted), "val/acc": correct / max(1, counted)}


def train_step(run: Bundle, batches: list, monitor=None) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Forward/backward over this step's CPU micro-batches, unscale, clip; returns (cross-entropy, grad norm, extra
    loss terms by name) as 0-dim fp32 device tensors (nothing read back to the host), the losses averaged over the
    micro-batches and summed over ranks (read_figures divides by the world size). No optimizer step."""
    model, forward_model, scaler, device = run.model, run.forward_model, run.scaler, run.hardware.device
    ce = torch.zeros((), device=device)
    extra: dict[str, torch.Tensor] = {}
    for i, batch in enumerate(batches):  # (x, y), or (x, y, document ids) with data.doc_mask
        x, y = batch[0].to(device, non_blocking=True), batch[1].to(device, non_blocking=True)  # pinned on CUDA: async
        docs = batch[2].to(device, non_blocking=True) if len(batch) > 2 else None
        sync = i == len(batches) - 1 or not hasattr(forward_model, "no_sync")
        with forward_model.no_sync() if not sync else contextlib.nullcontext():  # all-reduce on the last only
            with run.hardware.autocast():
                loss = training_loss(forward_model, x, y, docs)
            scaler.scale(loss.total / len(batches)).backward()
        ce += loss.cross_entropy.detach().float() / len(batches)
        for name, term in loss.extra.items():
            extra[name] = extra.get(name, torch.zeros((), device=device)) + term.detach().float() / len(batches)
    scaler.unscale_(run.optimizer)  # a no-op unless fp16: clipping sees the true gradients
    if monitor is not None:
        monitor.grads_ready()  # per-group norms before clipping (train.diagnostics / spike_factor)
    clip = run.settings.grad_clip if run.settings.grad_clip > 0 else float("inf")
    grad_norm = distributed.clip_grad_norm(model.parameters(), clip)  # the global norm, also over FSDP2 shards
    if run.ctx.world > 1:  # enqueued on the device: no wait here
        reduced = torch.stack([ce, *extra.values()])
        torch.distributed.all_reduce(reduced)
        ce, extra = reduced[0], dict(zip(extra, reduced[1:]))
    return ce, grad_norm, {f"train/{name}": v for name, v in extra.items()}


def set_lr(run: Bundle, step: int) -> None:
    """Every param group's lr for `step`: its initial lr (kept as `initial_lr` the first time) x the schedule's
    factor. The loop's and the timing session's (gptlab/train/timing.py) one way to set it."""
    factor = run.schedule(step)
    for group in run.optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
        group["lr"] = group["initial_lr"] * factor


def apply_update(run: Bundle) -> None:
    """The optimizer step after train_step: through the GradScaler (fp16: skipped when the scaled gradients
    overflowed, the scale then shrinks), then the gradients freed. The loop's and the timing session's one update."""
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)


def read_figures(values: list[float], names: list[str], world: int) -> tuple[float, float, dict[str, float]]:
    """(loss, grad norm, extra terms) from one step's figures read back as [loss sum, grad norm, *term sums]."""
    loss, grad_norm, *terms = values
    if world > 1:  # divided here, in double precision, as the rows always were
        loss, terms = loss / world, [v / world for v in terms]
    return loss, grad_norm, dict(zip(names, terms))


def nonfinite(loss: float, grad_norm: float, scaler) -> bool:
    """A non-finite loss, or gradient (fp16's scaler handles its own overflowed gradients)."""
    return not math.isfinite(loss) or (not math.isfinite(grad_norm) and not scaler.is_enabled())


def skip_step(optimizer, scaler, loss, grad_norm, p: Progress, settings, ctx) -> None:
    """A non-finite loss (or gradient, without an fp16 scaler): drop the step, or stop past train.nan_skip."""
    p.nan_seen += 1
    optimizer.zero_grad(set_to_none=True)
    if scaler.is_enabled():
        scaler.update()
    if p.nan_seen > settings.nan_skip:
        raise TrainingDiverged(diverged_message(loss, grad_norm, p.step + 1, p.nan_seen, settings, ctx))
    log.warning(
        "step %d: loss %s, grad norm %s; skipped (%d of train.nan_skip=%d)",
        p.step + 1,  # the step's number as its row would carry it, as the anomaly and spike lines name it
        loss,
        grad_norm,
        p.nan_seen,
        settings.nan_skip,
    )
    p.step += 1


def diverged_message(loss, grad_norm, step, nan_seen, settings, ctx) -> str:
    """The one-line reason a run stops on a non-finite loss or gradient, with the checkpoint it keeps; `step` numbers
    the step as its metrics row would (1 = the first update), as every line about one step does."""
    last = checkpoint.latest_path(ctx.run_dir)
    kept = f"last good checkpoint: {last}" if last else "no checkpoint was written yet"
    return (
        f"train: loss {loss}, grad norm {grad_norm} at step {step} ({nan_seen} non-finite steps, "
        f"train.nan_skip={settings.nan_skip}); {kept}; lower optimizer.lr or raise train.nan_skip"
    )


def warmup_seconds(p: Progress) -> float | None:
    """What the warm-up steps (train.speed_warmup, kept out of every speed median) took beyond as many steady
    steps: torch.compile's compilation with hardware.compile, autotuning, first allocations. None before both
    kinds of step exist."""
    steady = median(p.step_ms)
    if not p.warmup_ms or steady is None:
        return None
    return (sum(p.warmup_ms) - len(p.warmup_ms) * steady) / 1000


def summarise(p: Progress, status: str, ctx: Context) -> dict:
    """The run's summary figures, computed from its progress alone (so a resumed run reports the whole run). A run a
    tune pruner stopped has no final or best val loss (its curve was judged hopeless mid-way, not finished): it says
    where it stopped, `pruned_at_step`."""
    pruned = status == "pruned"
    return {
        "final_val_loss": None if pruned else p.last_val_loss,
        "best_val_loss": p.best_val_loss if math.isfinite(p.best_val_loss) and not pruned else None,
        **({"pruned_at_step": p.last_val_step} if pruned else {}),
        "steps": p.step,
        "tokens": p.tokens,
        "tokens_per_s_median": median(p.tokens_per_s),
        "step_ms_median": median(p.step_ms),
        "data_ms_median": median(p.data_ms),
        "mfu_median": median(p.mfu) if ctx.peak_flops else None,
        "warmup_s": warmup_seconds(p),
        "peak_mem_bytes": p.peak_mem_bytes,
        "wall_s": p.wall_s,
        "train_s": p.train_s,
        "status": status,
        "outside_load": p.outside_ticks / p.total_ticks if p.total_ticks else None,
        "sibling_load": p.sibling_ticks / p.total_ticks if p.total_ticks else None,  # the sweep's other runs
        **({"probe_s": p.probe_s, **p.last_probes} if p.last_probes else {}),  # the last eval's probe/* values
    }


def save_checkpoint(model, optimizer, scaler, p: Progress, ctx: Context) -> None:
    """Sharded: every rank writes its shards (collective). Single file: rank 0 writes, the others wait for it. Either
    way every rank's RNG state goes in (collective), so each rank resumes its own dropout stream."""
    rng_ranks = resume.gather_rng(ctx.world)
    if ctx.sharded:
        sharded.save(
            ctx.run_dir,
            p.step,
            model,
            optimizer,
            resume.state_dict(model, optimizer, scaler, p, ctx.identity, rng_ranks),
            ctx.rank,
            ctx.world,
        )
        return
    if ctx.is_main:
        state = resume.state_dict(model, optimizer, scaler, p, ctx.identity, rng_ranks)
        checkpoint.save(ctx.run_dir, p.step, state)
    if ctx.world > 1:
        torch.distributed.barrier()


class Trial(Protocol):
    """A tune trial the run reports to (gptlab.sweep.prune.TrialReport, made by gptlab-train only under a pruning
    sweeper): its val loss at each eval in; True out when the run stops there as pruned."""

    def at_eval(self, step: int, val_loss: float, last: bool) -> bool: ...


def train(
    run: Bundle,
    sinks: list,
    progress: Progress | None = None,
    resumed: bool = False,
    stop: StopFlag | None = None,
    trial: Trial | None = None,
) -> dict:
    """Train the built run from `progress` (resume.restore's result; None = step 0) to train.max_steps; returns the
    summary figures. With a `trial`, each eval's val loss is reported to it, and the run ends as "pruned" where it
    says so."""
    p = progress or Progress()
    own_stop, stop = stop is None, stop or StopFlag()  # a flag made here is taken down here
    # train.prefetch steps ahead
    source = prefetch.batch_source(run.data, run.settings, run.ctx.rank, run.ctx.world, run.hardware.device, p.step)
    try:
        return _Loop(run, sinks, p, resumed, stop, source, trial).run()
    finally:
        source.close()  # whatever ended the loop: no batch thread outlives train()
        if own_stop:
            stop.restore()


@dataclass
class _Pending:
    """A trained step whose figures are still on the device: read back at the next sync point (_Loop.flush)."""

    step: int  # its row's step (the step index it trained + 1)
    figures: torch.Tensor  # (2 + terms,) [loss, grad norm, *extra terms] on the device
    names: list[str]  # the extra terms' keys
    lr: float
    tokens: int
    data_s: float
    diag_s: float
    start: Any  # StepClock marks
    end: Any
    extra: dict  # the monitor's keys for its row (diag/, spike/)


@dataclass(eq=False)
class _Loop:
    """One call of train(): the built run it drives, its progress `p`, its clocks and its load sampler."""

    bundle: Bundle
    sinks: list
    p: Progress
    resumed: bool
    stop: StopFlag
    source: Any
    trial: Trial | None = None

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
        if getattr(self.bundle.data, "doc_mask", False):  # val loss through the same document mask as training
            self.val_set = (*self.val_set, self.bundle.data.val_documents(settings.eval_sequences))
        # data.val_sets: each named set's fixed windows, scored beside val/loss as val/<name>/loss
        self.val_sets = {s.metric: s.samples(s.count(settings.eval_sequences)) for s in self.bundle.val_sets}
        self.tokens_per_step = settings.batch_size * self.bundle.data.seq_len
        self.planned_evals = flops_eval_steps(
            settings.eval_flops, self.tokens_per_step * self.bundle.ctx.flops_per_token, settings.max_steps
        )
        self.status, self.wall0, self.started = "finished", p.wall_s, time.perf_counter()
        # how busy the machine is besides this run
        self.load = job_sampler(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        self.monitor = diagnostics.Monitor(
            self.bundle.model, self.bundle.data, self.bundle.hardware, settings, self.bundle.ctx
        )
        self.clock, self.pending = StepClock(self.device), []  # type: StepClock, list[_Pending]
        self.each_step = checks_each_step(settings)
        self.flag_group = distributed.host_group(self.device, self.bundle.ctx.world)

    def wall(self) -> float:
        return self.wall0 + time.perf_counter() - self.started

    def train_clock(self) -> dict:
        """The training-only clock as a row's x-axis `train_s` (absent for a run begun before it was kept)."""
        return {} if self.p.train_s is None else {"train_s": self.p.train_s}

    def run(self) -> dict:
        self.bundle.model.train()
        while self._between_steps():
            self._step()
        _bank_load(self.load, self.p)
        return summarise(self.p, self.status, self.bundle.ctx)

    def _between_steps(self) -> bool:
        """Eval and checkpoint where due at the current step; False when the run ends here."""
        p, settings, ctx = self.p, self.bundle.settings, self.bundle.ctx
        if p.step == self.start_step + settings.speed_warmup:
            self.load.start()  # measured over the timed steps only
        if _eval_due(p, settings, self.start_step, self.resumed, self.planned_evals):
            self.flush()  # no eval row after a step that went non-finite
            ev = evaluate(self.bundle.model, self.val_set, self.micro_bs, self.bundle.hardware, self.device)
            p.last_val_loss, p.best_val_loss = ev["val/loss"], min(p.best_val_loss, ev["val/loss"])
            p.last_val_step = p.step
            sets = {  # data.val_sets: val/<name>/loss, each on its own fixed windows
                k: evaluate(self.bundle.model, s, self.micro_bs, self.bundle.hardware, self.device)["val/loss"]
                for k, s in self.val_sets.items()
            }
            p.last_val_sets = sets or p.last_val_sets
            probed, probe_s = measure_probes(  # train.probes: their own fixed sets, no RNG drawn
                self.bundle.probes, self.bundle.model, self.bundle.hardware, self.micro_bs * self.bundle.data.seq_len
            )
            p.last_probes, p.probe_s = probed or p.last_probes, p.probe_s + probe_s
            row = {
                "val/loss": ev["val/loss"],
                **({"val/acc": ev["val/acc"]} if self.bundle.data.reports_accuracy else {}),
                **sets,
                **probed,
                **({"perf/probe_ms": 1000 * probe_s} if probed else {}),
                "tokens": p.tokens,
                "wall_s": self.wall(),
                **self.train_clock(),
                "flops": p.tokens * self.bundle.ctx.flops_per_token,  # cumulative training FLOPs (the MFU model's)
            }  # every row has all x-axes
            _emit(self.sinks, ctx, row, p.step)
            pruned = self._pruned(ev["val/loss"])
        else:
            pruned = False
        stopping = _agree(self.stop.signum is not None, ctx, self.flag_group)
        if p.step != self.start_step:  # a resumed run that trains nothing keeps its figures as they were
            p.wall_s = self.wall()
            p.peak_mem_bytes = max(p.peak_mem_bytes, self.peak.read())
        # checkpoint after this step's eval row is written, so a resume never re-logs or loses a row
        ckpt_due = settings.ckpt_interval and p.step % settings.ckpt_interval == 0
        if ckpt_due or p.step >= settings.max_steps or stopping:
            self.flush()  # every step so far read back finite: a NaN step never reaches a checkpoint
        if (ckpt_due or p.step >= settings.max_steps or stopping) and p.step != self.start_step:
            _bank_load(self.load, p)
            save_checkpoint(self.bundle.model, self.bundle.optimizer, self.bundle.scaler, p, ctx)
        if p.step >= settings.max_steps:
            return False
        if pruned:  # no checkpoint of its own: a pruned trial is not resumed
            self.status = "pruned"
            return False
        if stopping:
            self.status = self.stop.status if self.stop.signum is not None else "preempted"  # another rank's signal
            return False
        return True

    def _pruned(self, val_loss: float) -> bool:
        """Report this eval to the tune trial (rank 0; not the run's first step: an untrained or already reported
        model); whether its pruner stops the run here, the same answer on every rank."""
        p, ctx = self.p, self.bundle.ctx
        if self.trial is None or p.step == self.start_step:
            return False
        asked = ctx.is_main and self.trial.at_eval(p.step, val_loss, last=p.step >= self.bundle.settings.max_steps)
        return _agree(asked, ctx, self.flag_group)

    def _step(self) -> None:
        """One optimizer step (or a skipped non-finite one); its figures wait on the device until the next sync point.

        Step time: waiting for this step's batches (data_ms) + moving them + forward/backward + optimizer step, from
        StepClock marks (on CUDA the GPU's time between them); eval, checkpoints and the diagnostics' own time fall
        outside it.
        """
        p, optimizer, scaler, monitor = self.p, self.bundle.optimizer, self.bundle.scaler, self.monitor
        settings = self.bundle.settings
        set_lr(self.bundle, p.step)
        start = self.clock.mark()
        t0 = time.perf_counter()
        batches = self.source.take(p.step)  # a skipped step is not redrawn: p.step moves on, as does the prefetcher
        data_s = time.perf_counter() - t0
        monitor.start(p.step)
        loss, grad_norm, terms = train_step(self.bundle, batches, monitor)
        figures = torch.stack([loss, grad_norm, *terms.values()])  # (2 + terms,) still on the device
        seen = None
        if self.each_step:  # read now: the step can still be dropped, replayed or flagged (one host sync)
            seen = read_figures(figures.tolist(), list(terms), self.bundle.ctx.world)
            if nonfinite(seen[0], seen[1], scaler):
                monitor.nonfinite(batches, p.step)
                skip_step(optimizer, scaler, seen[0], seen[1], p, settings, self.bundle.ctx)
                return
        monitor.before_update()
        apply_update(self.bundle)
        extra = monitor.after_update(p.step, seen[0] if seen else math.nan, batches)  # NaN: no spike check asked
        diag_s = monitor.take_spent()  # the diagnostics' own time: not the step's, reported as diag_ms
        end = self.clock.mark()
        p.step += 1
        p.tokens += self.tokens_per_step
        lr = optimizer.param_groups[0]["lr"]
        self.pending.append(_Pending(p.step, figures, list(terms), lr, p.tokens, data_s, diag_s, start, end, extra))
        if self.each_step or p.step % settings.log_interval == 0 or p.step == settings.max_steps:
            self.flush()

    def flush(self) -> None:
        """Read the pending steps' figures back together (the one host sync), stop at the first non-finite one, and
        record the others in order."""
        if not self.pending:
            return
        done, self.pending = self.pending, []
        values = torch.stack([d.figures for d in done]).tolist()  # (steps, 2 + terms)
        self.clock.settle(done[-1].end)
        for d, v in zip(done, values):
            loss, grad_norm, terms = read_figures(v, d.names, self.bundle.ctx.world)
            if nonfinite(loss, grad_norm, self.bundle.scaler):  # train.nan_skip=0: found here, the run stops
                self.p.nan_seen += 1
                message = diverged_message(
                    loss, grad_norm, d.step, self.p.nan_seen, self.bundle.settings, self.bundle.ctx
                )
                raise TrainingDiverged(message)
            self._record(d, loss, grad_norm, terms, self.clock.seconds(d.start, d.end) - d.diag_s)

    def _record(self, d: _Pending, loss: float, grad_norm: float, terms: dict, step_s: float) -> None:
        """A finished step's speed figures into the progress; its row to the sinks at log steps (or a spike's)."""
        p, settings, tokens_per_step = self.p, self.bundle.settings, self.tokens_per_step
        step_mfu = mfu(
            self.bundle.ctx.flops_per_token, tokens_per_step / step_s, self.bundle.ctx.peak_flops, self.bundle.ctx.world
        )
        if p.train_s is not None:
            p.train_s += step_s
        if d.step - self.start_step <= settings.speed_warmup:  # each start warms up: a resume compiles, allocates
            p.warmup_ms.append(step_s * 1000)
        else:
            p.tokens_per_s.append(tokens_per_step / step_s)
            p.step_ms.append(step_s * 1000)
            p.data_ms.append(d.data_s * 1000)
            p.mfu.append(step_mfu or 0.0)
        if d.step % settings.log_interval == 0 or d.step == settings.max_steps:
            row = {
                "train/loss": loss,
                **terms,  # extra loss terms (train/<name>) beside the cross-entropy
                "train/lr": d.lr,
                "train/grad_norm": grad_norm,
                "tokens": d.tokens,
                "perf/tokens_per_s": tokens_per_step / step_s,
                "perf/step_ms": step_s * 1000,
                "perf/data_ms": d.data_s * 1000,
                "perf/mfu": step_mfu,
                "mem/peak_bytes": max(p.peak_mem_bytes, self.peak.read()),
                "wall_s": self.wall(),
                **self.train_clock(),
                "flops": d.tokens * self.bundle.ctx.flops_per_token,  # an x-axis: loss against compute
                **d.extra,
                **({"perf/diag_ms": d.diag_s * 1000} if self.monitor.diag is not None else {}),
            }
            _emit(self.sinks, self.bundle.ctx, row, d.step)
            self.load.sample()
        elif d.extra:  # a spike between log steps: its own row
            flops = d.tokens * self.bundle.ctx.flops_per_token
            _emit(
                self.sinks,
                self.bundle.ctx,
                {**d.extra, "tokens": d.tokens, "wall_s": self.wall(), **self.train_clock(), "flops": flops},
                d.step,
            )


def _bank_load(load, p: Progress) -> None:
    """Move the sampler's closed intervals into the progress (so a resume keeps the whole run's outside load)."""
    load.sample(force=True)
    p.outside_ticks += load.outside_ticks
    p.sibling_ticks += load.sibling_ticks
    p.total_ticks += load.total_ticks
    load.outside_ticks = load.sibling_ticks = load.total_ticks = load.own_ticks = 0


def _emit(sinks, ctx, row, step):
    if ctx.is_main:
        for sink in sinks:
            sink.log(row, step)
