"""LR schedules: pure functions of the step giving a multiplier of the optimizer's base lr.

Every schedule warms up linearly from 1/(warmup_steps+1) to 1 over `warmup_steps`, then follows its
shape down to `min_lr_ratio` at `max_steps` (constant stays at 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated

from gptlab.util.checks import rule


@dataclass(frozen=True)
class Schedule:
    """Base: warmup then `shape(progress)` with progress in [0, 1] over the post-warmup steps."""

    max_steps: int
    warmup_steps: Annotated[int, rule(">= 0")] = 0
    min_lr_ratio: Annotated[float, rule("[0, 1]")] = 0.1  # the final lr as a fraction of optimizer.lr

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        span = max(1, self.max_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * self.shape(progress)

    def shape(self, progress: float) -> float:
        """1 at progress 0 falling to 0 at progress 1."""
        raise NotImplementedError


class Cosine(Schedule):
    """Half-cosine decay to min_lr_ratio."""

    def shape(self, progress):
        return 0.5 * (1 + math.cos(math.pi * progress))


class Linear(Schedule):
    """Linear decay to min_lr_ratio."""

    def shape(self, progress):
        return 1 - progress


@dataclass(frozen=True)
class Constant(Schedule):
    """Flat at 1 after warmup. It takes no min_lr_ratio (nothing decays): `schedule.min_lr_ratio` under
    schedule=constant is refused as a key this choice does not take, not silently ignored."""

    min_lr_ratio: float = field(default=1.0, init=False)

    def shape(self, progress):
        return 1.0

    def __call__(self, step: int) -> float:
        return super().__call__(step) if step < self.warmup_steps else 1.0


@dataclass(frozen=True)
class WSD(Schedule):
    """Warmup-stable-decay: flat at 1, then a linear cooldown over the last `decay_fraction` of the post-warmup steps
    (as every shape here spans them: max_steps 500, warmup 50, 0.2 cools down over the last 90 steps)."""

    decay_fraction: Annotated[float, rule("(0, 1]")] = 0.2

    def shape(self, progress):
        start = 1 - self.decay_fraction
        return 1.0 if progress <= start else max(0.0, (1 - progress) / self.decay_fraction)
