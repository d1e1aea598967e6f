"""Training diagnostics: why an arm wins, not only that it does. None of it changes the curve.

`train.diagnostics=true`, at every log step, per block and component kind (`attn`, `mlp`, `norm`; `embed` and `final`
outside the blocks): gradient norm (before clipping; the groups' norms combine to the global `grad_norm`), parameter
norm, update-to-parameter ratio ||w_after - w_before|| / ||w_before|| over the optimizer step, each block output's RMS,
and for attention the largest pre-softmax logit and the mean attention entropy (nats). The last three come from a
no-grad probe forward (eval mode, so no dropout and no RNG draw) over the step's first PROBE_SEQUENCES sequences, in
which each attention layer's kernel is wrapped to compute the explicit scores beside it. Keys:
`diag/layer03/attn/grad_norm`, `diag/layer03/block/act_rms`, `diag/embed/param_norm`, ...

`train.spike_factor=F`: a step whose loss exceeds F x the median of the previous `train.spike_window` losses is a
spike event (`spike/loss`, `spike/median`, `spike/ratio`, `spike/layers`: the groups whose grad norm rose most against
their own median). `train.spike_dump=true` also writes the step's batch to `diagnostics/spike_step_N.pt` (x, y and the
sample range: batches are a pure function of the step, so `data.train_samples(first, count)` replays it exactly).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from gptlab.model.attention.kernels import allowed_mask, expand_kv
from gptlab.train.anomaly import find_anomaly

log = logging.getLogger(__name__)

PROBE_SEQUENCES = 2  # the probe builds (n, H, T, T) scores per layer: a couple of sequences bound its memory
WRAPPERS = {"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module", "module"}


def layer_tag(index: int, n_layer: int) -> str:
    """'layer03' (two digits, more past 100 layers): sorts in layer order in W&B and in files."""
    return f"layer{index:0{max(2, len(str(n_layer - 1)))}d}"


def group_of(name: str, n_layer: int) -> str:
    """A parameter's group: 'layer03/attn' | 'layer03/mlp' | 'layer03/norm' | 'embed' | 'final'."""
    parts = [p for p in name.split(".") if p not in WRAPPERS]
    if parts[0] == "blocks":
        kind = "norm" if parts[2].startswith("norm") else parts[2]
        return f"{layer_tag(int(parts[1]), n_layer)}/{kind}"
    return "embed" if parts[0] in ("wte", "position") else "final"


def param_groups(model) -> dict[str, list[torch.nn.Parameter]]:
    """Every trainable parameter (shared ones once) by group, in the model's order."""
    n_layer, groups = len(model.blocks), {}  # type: int, dict[str, list[torch.nn.Parameter]]
    for name, p in model.named_parameters():
        if p.requires_grad:
            groups.setdefault(group_of(name, n_layer), []).append(p)
    return groups


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a (possibly FSDP2-sharded) tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def _sharded(groups: dict) -> bool:
    return any(hasattr(p, "to_local") for ps in groups.values() for p in ps)


def group_norms(groups: dict, pick) -> dict[str, float]:
    """{group: L2 norm of pick(p) over its parameters} (None from pick = skipped); summed over FSDP2 shards."""
    device = next(p for ps in groups.values() for p in ps).device
    sums = torch.zeros(len(groups), dtype=torch.float32, device=device)
    for i, ps in enumerate(groups.values()):
        for p in ps:
            t = pick(p)
            if t is not None:
                sums[i] += _local(t).detach().float().pow(2).sum()
    if _sharded(groups) and dist.is_initialized():
        dist.all_reduce(sums)  # each rank holds a disjoint shard: squares add up
    return {g: math.sqrt(s) for g, s in zip(groups, sums.tolist())}


class Diagnostics:
    """Per-group figures around one optimizer step; `rows` collects them as `diag/...` keys for the step's row."""

    def __init__(self, model, hardware):
        self.model, self.hardware, self.groups = model, hardware, param_groups(model)
        self._before: dict | None = None

    def grad_norms(self) -> dict[str, float]:
        return group_norms(self.groups, lambda p: p.grad)

    def before_step(self) -> None:
        """Snapshot the weights (only on diagnostic steps) for the update ratio."""
        self._before = {p: _local(p).detach().clone() for ps in self.groups.values() for p in ps}

    def after_step(self, grad_norms: dict[str, float]) -> dict[str, float | None]:
        """The step's per-group figures, once the optimizer has stepped."""
        before, self._before = self._before, None
        assert before is not None  # before_step ran on this step: both are gated by the same `due`
        w_norm = group_norms(self.groups, lambda p: before[p])
        delta = group_norms(self.groups, lambda p: _local(p).detach() - before[p])
        row: dict[str, float | None] = {}
        for g in self.groups:
            row[f"diag/{g}/grad_norm"] = grad_norms[g]
            row[f"diag/{g}/param_norm"] = w_norm[g]  # before the step: what the update ratio divides by
            row[f"diag/{g}/update_ratio"] = delta[g] / w_norm[g] if w_norm[g] > 0 else None
        return row

    @torch.no_grad()
    def probe(self, x: torch.Tensor, docs: torch.Tensor | None = None) -> dict[str, float]:
        """Block output RMS and attention max logit / entropy on x[:PROBE_SEQUENCES] (no grad, eval mode), with
        their document ids (data.doc_mask: the scores masked as training masks them)."""
        stats: dict[str, float] = {}
        model, n = self.model, len(self.model.blocks)
        with _recorded(model, stats, n):
            was_training = model.training
            model.eval()
            try:  # eager even when compiled in place: hooks and a swapped kernel would force recompiles
                with self.hardware.autocast(), torch.compiler.set_stance("force_eager"):
                    if docs is None:
                        model(x[:PROBE_SEQUENCES])
                    else:
                        model(x[:PROBE_SEQUENCES], docs=docs[:PROBE_SEQUENCES])
            finally:
                model.train(was_training)
        return stats


@contextmanager
def _recorded(model, stats: dict, n_layer: int):
    """Within: each block's output RMS and each attention layer's score statistics land in `stats`."""
    hooks, kernels = [], []
    for i, block in enumerate(model.blocks):
        tag = f"diag/{layer_tag(i, n_layer)}"
        hooks.append(
            block.register_forward_hook(
                lambda m, args, out, tag=tag: stats.__setitem__(
                    f"{tag}/block/act_rms", out.float().pow(2).mean().sqrt().item()
                )
            )
        )
        kernels.append((block.attn, block.attn.kernel))
        block.attn.kernel = _scoring(block.attn.kernel, stats, f"{tag}/attn")
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
        for attn, kernel in kernels:
            attn.kernel = kernel


def _scoring(kernel, stats: dict, prefix: str):
    """`kernel`, plus the explicit scores' max (masked positions excluded) and mean softmax entropy into `stats`."""

    def run(q, k, v, *, window=None, q_offset=0, bias=None, dropout_p=0.0, docs=None):
        scores = q.float() @ expand_kv(k, q.size(1)).float().transpose(-2, -1) / math.sqrt(q.size(-1))  # (B,H,Tq,Tk)
        if bias is not None:
            scores = scores + bias.float()
        ok = allowed_mask(q.size(2), k.size(2), q_offset, window, q.device) if docs is None else docs.allowed(window)
        scores = scores.masked_fill(~ok, float("-inf"))
        logp = torch.log_softmax(scores, dim=-1)
        entropy = -(logp.exp() * logp.masked_fill(~ok, 0.0)).sum(-1)  # (B, H, Tq)
        stats[f"{prefix}/max_logit"] = scores.amax().item()
        stats[f"{prefix}/entropy"] = entropy.mean().item()
        if docs is None:
            return kernel(q, k, v, window=window, q_offset=q_offset, bias=bias, dropout_p=dropout_p)
        return kernel(q, k, v, window=window, q_offset=q_offset, bias=bias, dropout_p=dropout_p, docs=docs)

    return run


class SpikeDetector:
    """Loss above factor x the running median of the last `window` losses (after at least min(10, window) of them)."""

    def __init__(self, factor: float, window: int):
        self.factor, self.window = factor, window
        self.losses: deque = deque(maxlen=window)
        self.norms: dict[str, deque] = {}

    def check(self, loss: float, grad_norms: dict[str, float]) -> dict | None:
        """The spike event's keys for this step's loss, or None; then remember the step."""
        event = None
        if len(self.losses) >= min(10, self.window):
            median = statistics.median(self.losses)
            if median > 0 and loss > self.factor * median:
                jumps = {
                    g: n / statistics.median(self.norms[g])
                    for g, n in grad_norms.items()
                    if g in self.norms and statistics.median(self.norms[g]) > 0
                }
                top = sorted(jumps, key=jumps.__getitem__, reverse=True)[:3]
                event = {
                    "spike/loss": loss,
                    "spike/median": median,
                    "spike/ratio": loss / median,
                    "spike/layers": ", ".join(f"{g} x{jumps[g]:.1f}" for g in top),
                }
        self.losses.append(loss)
        for g, n in grad_norms.items():
            self.norms.setdefault(g, deque(maxlen=self.window)).append(n)
        return event


def dump_batch(run_dir: Path, step: int, batches: list, first: int, count: int) -> Path:
    """The spike step's batch (this rank's micro-batches) and its global sample range, for an exact replay."""
    out = Path(run_dir) / "diagnostics" / f"spike_step_{step:07d}.pt"
    out.parent.mkdir(parents=True, exist_ok=True)
    x = torch.cat([b[0] for b in batches]).cpu()
    y = torch.cat([b[1] for b in batches]).cpu()
    docs = {"docs": torch.cat([b[2] for b in batches]).cpu()} if len(batches[0]) > 2 else {}  # data.doc_mask
    torch.save({"step": step, "x": x, "y": y, **docs, "first_sample": first, "count": count}, out)
    return out


class Monitor:
    """What the loop calls around each step; does nothing unless train.diagnostics, train.spike_factor or
    train.detect_anomaly is set. Its own time is kept apart (take_spent) so step time and tokens/s stay the training's."""

    def __init__(self, model, data, hardware, settings, ctx):
        self.settings, self.ctx, self.model, self.data, self.hardware = settings, ctx, model, data, hardware
        self.spikes = SpikeDetector(settings.spike_factor, settings.spike_window) if settings.spike_factor else None
        self.diag = Diagnostics(model, hardware) if settings.diagnostics or self.spikes else None
        self.norms: dict | None = None
        self.due, self.spent = False, 0.0

    def start(self, step: int) -> None:
        """Before training step `step`: whether its row (step + 1) carries the diag/ keys."""
        s = self.settings
        self.due = s.diagnostics and ((step + 1) % s.log_interval == 0 or step + 1 == s.max_steps)
        self.norms = None

    def _clock(self) -> float:
        """Start timing the diagnostics' own work. On CUDA once the step's queued work has finished: their first read
        back (a norm's .tolist()) would otherwise wait for the forward and backward, and that wait, counted as theirs,
        came off the step's GPU time (perf/step_ms too low, tokens/s and MFU too high)."""
        if str(self.hardware.device).startswith("cuda"):
            torch.cuda.synchronize(self.hardware.device)
        return time.perf_counter()

    def grads_ready(self) -> None:
        """After backward, before clipping: the per-group gradient norms."""
        if self.diag is not None and (self.due or self.spikes is not None):
            t0 = self._clock()
            self.norms = self.diag.grad_norms()
            self.spent += time.perf_counter() - t0

    def before_update(self) -> None:
        if self.due:
            t0 = self._clock()
            self.diag.before_step()
            self.spent += time.perf_counter() - t0

    def after_update(self, step: int, loss: float, batches: list) -> dict:
        """Keys for the row of step + 1 (the trained step `step`): diag/ figures when due, spike/ on a spike."""
        row: dict = {}
        if not self.due and self.spikes is None:
            return row
        # the spike check alone reads the loss already read back: no device work, so no sync added to every step
        t0 = self._clock() if self.due else time.perf_counter()
        if self.due:
            row |= self.diag.after_step(self.norms)
            docs = batches[0][2].to(self.hardware.device) if len(batches[0]) > 2 else None  # data.doc_mask
            row |= self.diag.probe(batches[0][0].to(self.hardware.device), docs)
        event = self.spikes.check(loss, self.norms or {}) if self.spikes is not None else None
        if event is not None:
            row |= event
            log.warning(
                "loss spike at step %d: %.4g = %.1f x the running median %.4g; grad norm rose most in %s",
                step + 1,
                loss,
                event["spike/ratio"],
                event["spike/median"],
                event["spike/layers"] or "-",
            )
            if self.settings.spike_dump and self.ctx.is_main:
                b = self.settings.batch_size
                batch = self.data.train_samples(step * b, b)  # the whole global batch: a pure function of the step
                if getattr(self.data, "doc_mask", False):
                    batch = (*batch, self.data.train_documents(step * b, b))
                row["spike/dump"] = str(dump_batch(self.ctx.run_dir, step + 1, [batch], step * b, b))
        self.spent += time.perf_counter() - t0
        return row

    def nonfinite(self, batches: list, step: int) -> None:
        """A non-finite step: with train.detect_anomaly, replay it to name the first op (one warning line)."""
        if self.settings.detect_anomaly:
            line = find_anomaly(self.model, batches, self.hardware, self.hardware.device, self.ctx.run_dir, step + 1)
            log.warning("%s", line)

    def take_spent(self) -> float:
        spent, self.spent = self.spent, 0.0
        return spent
