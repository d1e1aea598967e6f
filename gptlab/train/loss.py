"""The one training objective: the step, the NaN replay (train/anomaly.py) and the profiler (train/profile/steps.py)
all call `training_loss`, so a new term (z-loss, label smoothing, ...) added here trains, replays and profiles the same
objective everywhere.

`train/loss` in metrics.jsonl stays the cross-entropy that arms are compared on; any extra term is returned beside it
(`Loss.extra`, logged as `train/<name>`) and only `Loss.total` is back-propagated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Loss:
    """One micro-batch's objective: `total` to back-propagate, its cross-entropy, and any extra terms by name."""

    total: torch.Tensor
    cross_entropy: torch.Tensor
    extra: dict[str, torch.Tensor] = field(default_factory=dict)


def training_loss(model, x: torch.Tensor, y: torch.Tensor, docs: torch.Tensor | None = None) -> Loss:
    """The model's next-token cross-entropy on (x, y) (B, T) ids, y = -100 unscored, with the (B, T) document ids of
    packed rows when the data has them (data.doc_mask); no extra terms today."""
    _, cross_entropy = model(x, y) if docs is None else model(x, y, docs=docs)
    return Loss(total=cross_entropy, cross_entropy=cross_entropy)
