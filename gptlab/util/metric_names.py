"""One name per metric, the same in metrics.jsonl, W&B, TensorBoard and CSV: each figure lives under its section
(`train/`, `val/` with `val/<name>/loss` per data.val_sets set, `perf/` for speed, `mem/` for memory, `diag/`,
`probe/`, `spike/`), beside the x-axes every row carries (`step`, `tokens`, `wall_s`, `train_s`: seconds in training
steps alone, and `flops`). Run dirs written before the sections existed used bare names; `canonical` reads such a row
under today's names, so every reader sees one vocabulary."""

from __future__ import annotations

from typing import Any

# a metric's bare name in older run dirs -> its name today
RENAMED = {
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "tokens_per_s": "perf/tokens_per_s",
    "step_ms": "perf/step_ms",
    "data_ms": "perf/data_ms",
    "diag_ms": "perf/diag_ms",
    "probe_ms": "perf/probe_ms",
    "mfu": "perf/mfu",
    "peak_mem_bytes": "mem/peak_bytes",
}
AXES = ("step", "tokens", "wall_s", "train_s", "flops")


def canonical(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row under today's names (an older run dir's bare names renamed; today's rows unchanged)."""
    return {RENAMED.get(key, key): value for key, value in row.items()}
