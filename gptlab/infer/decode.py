"""Measured decoding over a grid of (batch, context, cache) points: prefill time, decode tokens/s, per-token latency
p50/p90/p99, KV-cache bytes measured from the cache tensors vs gptlab-flops' prediction, and peak memory.

Plain torch (no Hydra): `measure(model, grid)` returns decode.json's `points`. One generation of a point: greedy
continuation of a random prompt of `context` tokens per sequence by `new_tokens` tokens. The prefill (a forward
over the prompt, giving the first new token) is timed alone; each of the new_tokens - 1 decode steps after it is
timed on its own (CUDA synchronised), so decode tokens/s = batch·(new_tokens - 1) / Σ step times and the latency
percentiles are over one generation's steps. cache=static keeps K/V in gptlab.infer.cache's preallocated caches
(a ring of `window` positions on sliding-window layers) and feeds one token per step; cache=none has no cache:
every step recomputes the whole context.

Keys of one point (each figure {"mean", "std", "values"} over the timed repeats; std null for one repeat):
  batch, context, cache, status ("measured" | "skipped"), reason (why skipped; null when measured),
  forward_tokens (tokens through forward passes in one generation), prefill_ms, decode_tokens_per_s,
  latency_ms_p50, latency_ms_p90, latency_ms_p99, peak_mem_bytes (the device's or process's peak),
  peak_mem_delta_bytes (the peak above what was in use when the generation started: on CUDA the bytes torch
  allocated above it, the cache plus activations; on CPU the growth of the process's resident set, page-granular:
  heap the process already holds, freed by earlier work, is reused without growing it, so a generation smaller than
  that free heap can read 0, while one larger always shows; `peak_mem_method` says which),
  kv_bytes_measured (cache_nbytes of the caches), kv_bytes_predicted (costs.memory.kv_cache at seq =
  context + new_tokens, windowed layers capped at their window), kv_bytes_ratio (measured / predicted; the three
  are null for cache=none), tokens_digest (the greedy tokens' sha1, 12 hex), same_tokens_as_none (static vs none
  at the same batch and context; null without both), outside_load (other processes' share of the cores).
"""

from __future__ import annotations

import gc
import hashlib
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import cast

import torch

from gptlab.costs.memory import kv_cache
from gptlab.costs.structure import describe
from gptlab.infer.cache import cache_nbytes, make_caches
from gptlab.runtime.cpu_load import LoadSampler
from gptlab.runtime.metrics import PeakMemory, sync

CACHES = ("static", "none")
PERCENTILES = (50, 90, 99)
MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class Grid:
    """The points to measure and how: every batch x context x cache, `repeats` timed generations after `warmup`."""

    batch_sizes: tuple[int, ...]
    contexts: tuple[int, ...]
    new_tokens: int
    caches: tuple[str, ...] = CACHES
    kv_quant: str | None = None  # the static cache's storage: None (the model's dtype) or "int8"
    repeats: int = 3
    warmup: int = 1
    seed: int = 0  # the random prompt tokens


@dataclass
class Generation:
    """One greedy generation, timed per forward pass."""

    tokens: torch.Tensor  # (B, new_tokens)
    prefill_s: float
    step_s: list[float]  # one per decode step (new_tokens - 1)
    forward_tokens: int  # B·T summed over the forward passes
    kv_bytes: int | None  # bytes the caches' tensors held; None for cache=none


def _greedy(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)


@torch.no_grad()
def generate(model, prompt: torch.Tensor, new_tokens: int, cache: str, quant: str | None = None) -> Generation:
    """Greedy continuation of prompt (B, T) by new_tokens tokens with cache "static" or "none"."""
    B, T = prompt.shape
    device = prompt.device
    caches = make_caches(model, B, T + new_tokens, quant=quant) if cache == "static" else None
    sync(device)
    start = perf_counter()
    nxt = _greedy(model(prompt, caches=caches)[0])
    sync(device)
    prefill_s, steps, idx, out, forward = perf_counter() - start, [], prompt, [nxt], prompt.numel()
    for _ in range(new_tokens - 1):
        idx = torch.cat([idx, nxt], dim=1) if caches is None else nxt  # none: the whole context again
        start = perf_counter()
        nxt = _greedy(model(idx, caches=caches)[0])
        sync(device)
        steps.append(perf_counter() - start)
        out.append(nxt)
        forward += idx.numel()
    kv = None if caches is None else cache_nbytes(caches)
    return Generation(torch.cat(out, dim=1), prefill_s, steps, forward, kv)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile, linear between closest ranks (numpy's default)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def spread(values: list[float]) -> dict:
    """{"mean", "std" (sample; null for one value), "values"}."""
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else None,
        "values": values,
    }


def predicted_kv_bytes(model, batch: int, max_len: int, quant: str | None = None) -> int:
    """gptlab-flops' KV-cache bytes for `max_len` positions: costs.memory.kv_cache's total_bytes_windowed (each
    windowed layer holds min(max_len, window) positions) in the model's dtype, or int8 with its fp16 scales."""
    s = next(model.parameters()).element_size()
    return int(kv_cache(describe(model), batch, max_len, s, quant)["total_bytes_windowed"])


def free_memory(device: torch.device) -> int | None:
    """Bytes free for a point: the GPU's free memory, or the host's MemAvailable; None when unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        line = next(x for x in MEMINFO.read_text().splitlines() if x.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024


def misfit(model, batch: int, context: int, cache: str, grid: Grid, free: int | None) -> str | None:
    """Why the point cannot run (too long for the model, or an estimate beyond free memory), else None."""
    total, block = context + grid.new_tokens, model.cfg.block_size
    if total > block and not model._extrapolates():
        return (
            f"context + new_tokens = {total} > model.block_size = {block}, and the position choice has no "
            f"embedding past block_size"
        )
    kv = predicted_kv_bytes(model, batch, total, grid.kv_quant) if cache == "static" else 0
    longest = context if cache == "static" else total - 1  # tokens of the largest forward pass
    need = kv + batch * longest * model.cfg.vocab_size * next(model.parameters()).element_size()
    if free is not None and need > free:
        return (
            f"estimated {need / 2**30:.2f} GiB (KV cache + logits of the largest forward) > {free / 2**30:.2f} GiB free"
        )
    return None


def peak_method(device: torch.device) -> str:
    """How peak memory is measured on this device (decode.json `peak_mem_method`)."""
    if device.type == "cuda":
        return "torch.cuda.max_memory_allocated (reset per generation)"
    meter = PeakMemory("cpu")
    return (
        "process VmHWM (reset per generation through /proc/self/clear_refs); delta = resident growth, "
        "page-granular: heap already held is reused unseen"
        if meter.hwm_reset
        else "process VmRSS sampled before and after each generation (clear_refs refused); delta = resident growth"
    )


def _timed(model, prompt: torch.Tensor, grid: Grid, cache: str) -> tuple[Generation, int, int]:
    """(generation, peak bytes, peak bytes above the start) of one timed generation."""
    device = prompt.device
    gc.collect()
    meter = PeakMemory(str(device))  # resets the peak
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else meter.sampled
    gen = generate(model, prompt, grid.new_tokens, cache, grid.kv_quant if cache == "static" else None)
    peak = meter.read()
    return gen, peak, max(0, peak - base)


def measure_point(model, batch: int, context: int, cache: str, grid: Grid) -> dict:
    """One measured point (keys in the module docstring)."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(grid.seed)
    prompt = torch.randint(0, model.cfg.vocab_size, (batch, context), generator=gen).to(device)
    for _ in range(grid.warmup):
        generate(model, prompt, grid.new_tokens, cache, grid.kv_quant if cache == "static" else None)
    load = LoadSampler()
    load.start()
    runs = [_timed(model, prompt, grid, cache) for _ in range(grid.repeats)]
    first = runs[0][0]
    steps = [g.step_s for g, _, _ in runs]
    measured = first.kv_bytes
    predicted = None if measured is None else predicted_kv_bytes(model, batch, context + grid.new_tokens, grid.kv_quant)
    point = {
        "batch": batch,
        "context": context,
        "cache": cache,
        "status": "measured",
        "reason": None,
        "forward_tokens": first.forward_tokens,
        "prefill_ms": spread([1e3 * g.prefill_s for g, _, _ in runs]),
        "decode_tokens_per_s": spread([batch * len(s) / sum(s) for s in steps]),
    }
    point |= {f"latency_ms_p{q}": spread([1e3 * percentile(s, q) for s in steps]) for q in PERCENTILES}
    point |= {
        "peak_mem_bytes": spread([p for _, p, _ in runs]),
        "peak_mem_delta_bytes": spread([d for _, _, d in runs]),
        "kv_bytes_measured": measured,
        "kv_bytes_predicted": predicted,
        "kv_bytes_ratio": None if measured is None else measured / cast(int, predicted),  # set with measured
        "tokens_digest": hashlib.sha1(first.tokens.cpu().numpy().tobytes()).hexdigest()[:12],
        "same_tokens_as_none": None,
        "outside_load": load.mean(),
    }
    return point


def skipped(batch: int, context: int, cache: str, reason: str) -> dict:
    return {"batch": batch, "context": context, "cache": cache, "status": "skipped", "reason": reason}


def _match_none(points: list[dict]) -> None:
    """Mark each measured static point with whether its greedy tokens equal cache=none's at the same shape."""
    none = {
        (p["batch"], p["context"]): p["tokens_digest"]
        for p in points
        if p["cache"] == "none" and p["status"] == "measured"
    }
    for p in points:
        if p["cache"] == "static" and p["status"] == "measured" and (p["batch"], p["context"]) in none:
            p["same_tokens_as_none"] = p["tokens_digest"] == none[(p["batch"], p["context"])]


def measure(model, grid: Grid, on_point: Callable[[dict], None] | None = None) -> list[dict]:
    """Every point of the grid, measured or skipped with its reason (never left out); on_point sees each."""
    device = next(model.parameters()).device
    points = []
    for batch in grid.batch_sizes:
        for context in grid.contexts:
            for cache in grid.caches:
                reason = misfit(model, batch, context, cache, grid, free_memory(device))
                try:
                    point = (
                        skipped(batch, context, cache, reason)
                        if reason
                        else measure_point(model, batch, context, cache, grid)
                    )
                except RuntimeError as err:  # torch.OutOfMemoryError on a GPU; the CPU allocator's is a RuntimeError
                    if not isinstance(err, torch.OutOfMemoryError) and "can't allocate memory" not in str(err):
                        raise
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                    point = skipped(batch, context, cache, f"out of memory: {str(err).splitlines()[0][:200]}")
                points.append(point)
                if on_point:
                    on_point(point)
    _match_none(points)
    return points
