"""The compared runs as a section of the report document: each run (label, seed, run dir, W&B run, outside load) and
the settings every run shares, so the page says what was compared without a link out."""

from __future__ import annotations

import os

from gptlab.compare.reading.like import UNSET, value
from gptlab.compare.reading.runs import wandb_identity
from gptlab.compare.render.sections import Runs
from gptlab.compare.tables.analysis import Comparison

SHARED_KEYS = (
    "model",
    "model.n_layer",
    "model.d_model",
    "model.n_head",
    "optimizer",
    "optimizer.lr",
    "schedule",
    "schedule.warmup_steps",
    "train.max_steps",
    "train.batch_size",
    "tokens_per_step",
    "data",
    "data_fingerprint",
    "data_seed",
    "train.eval_sequences",
    "seq_len",
)


def _wandb_text(run) -> str:
    """The run's W&B path as text (entity/project/id; no URL: the page stays self-contained), or why there is none."""
    ident = wandb_identity(run)
    if not ident["id"]:
        return "–"
    where = "/".join(p for p in (ident["entity"], ident["project"]) if p)
    return f"{where}/runs/{ident['id']}" if where else f"run id {ident['id']}"


def shared_settings(cmp: Comparison) -> list[tuple[str, str]]:
    """(key, value) of SHARED_KEYS over every compared run: the value, 'not recorded' where no run's files hold
    the key (an older run, a key that arrived later), or 'differs between arms'."""
    runs = [r for g in cmp.groups for r in g.runs]
    out = []
    for key in SHARED_KEYS:
        seen = {value(r, key) for r in runs}
        one = seen.pop() if len(seen) == 1 else "differs between arms (see the notes)"
        out.append((key, "not recorded" if one == UNSET else one))
    return out


def section(cmp: Comparison) -> Runs:
    """The compared runs (label, seed, dir, W&B run, outside load) and the settings every run shares."""
    found = [(g.label, r) for g in cmp.groups for r in g.runs]
    paths = [str(r.path) for _, r in found]
    root = os.path.commonpath(paths) if len(paths) > 1 else str(found[0][1].path.parent)
    rows = tuple(
        (
            label,
            str(r.config.get("seed")),
            os.path.relpath(r.path, root),
            _wandb_text(r),
            "–" if (load := r.summary.get("outside_load")) is None else f"{100 * float(load):.0f}%",
        )
        for label, r in found
    )
    return Runs(root, rows, tuple(shared_settings(cmp)))
