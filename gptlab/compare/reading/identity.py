"""A run's unique identity, so that a copied run directory counts once.

Identity, in order of preference:
- the W&B run id (summary.json `wandb.id`, else the `wandb_run_id` file) together with the run's resolved config:
  one W&B run is one training run, wherever its directory was copied to, even a copy taken before it finished;
  the config is part of the key so that an id reused by hand for another configuration is never merged;
- otherwise a SHA-256 of metrics.jsonl, summary.json and the config (canonical JSON): two real runs never write
  the same metrics (their wall times differ), two seeds differ in config, so equal content is one run copied.

dedupe keeps one run per identity (the one that got furthest, then the first found) and names every copy it
left out in a warning.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from gptlab.compare.reading.runs import Run, common_root, wandb_identity, where
from gptlab.util.note import Note, warning


@dataclass(frozen=True)
class Identity:
    """key: equal for two dirs of one run; how: what made them equal, in words (for the warning)."""

    key: str
    how: str


def _canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, default=str).encode()


def _file_bytes(run: Run, name: str) -> bytes:
    path = run.path / name
    return path.read_bytes() if path.is_file() else b""


def identity(run: Run) -> Identity:
    """The run's identity: its W&B id and config, else a hash of its metrics, summary and config."""
    config = hashlib.sha256(_canonical(run.config)).hexdigest()
    wandb_id = wandb_identity(run)["id"]
    if wandb_id:
        return Identity(f"wandb:{wandb_id}:{config}", f"the same W&B run id {wandb_id} and config")
    digest = hashlib.sha256()
    for part in (_file_bytes(run, "metrics.jsonl"), _file_bytes(run, "summary.json"), config.encode()):
        digest.update(hashlib.sha256(part).digest())
    return Identity(f"content:{digest.hexdigest()}", "identical metrics.jsonl, summary.json and config")


def dedupe(runs: list[Run]) -> tuple[list[Run], list[Note]]:
    """(one run per identity in first-seen order, one warning per copy left out).

    Of the dirs of one run the one with the most val/loss evals is kept (a copy taken mid-run has fewer), ties to
    the first found.
    """
    by_key: dict[str, list[Run]] = {}
    how: dict[str, str] = {}
    for run in runs:
        ident = identity(run)
        by_key.setdefault(ident.key, []).append(run)
        how[ident.key] = ident.how
    root = common_root(runs)
    keep: set[int] = set()
    warnings = []
    for key, same in by_key.items():
        best = max(same, key=lambda r: len(r.val_steps()))  # max keeps the first of equals
        keep.add(id(best))
        for copy in same:
            if copy is not best:
                warnings.append(
                    warning(
                        f"{where(copy, root)} is a copy of {where(best, root)} ({how[key]}): counted once, as "
                        f"{where(best, root)}",
                        subject=where(copy, root),
                    )
                )
    return [r for r in runs if id(r) in keep], warnings
