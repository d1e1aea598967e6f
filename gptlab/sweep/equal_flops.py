"""Equal compute by construction: one grid of cumulative training FLOPs that every arm of a sweep evaluates at.

`gptlab-sweep NAME --equal-flops N` (or `equal_flops: N` in a sweep file) costs each arm before anything runs,
exactly as gptlab-train will (the arm's composed config, the vocabulary of its data, training FLOPs per token of the
model on the meta device, batch_size x sequence length tokens per step), takes the smallest total any arm trains
(train.max_steps x FLOPs per step: the budget every arm reaches) and splits it into N equal points. Every run gets
`train.eval_flops=[...]` with those points, so each arm evaluates a step either side of each one and gptlab-compare
reads val loss at equal FLOPs where it was measured, never interpolated across a coarse eval interval toward the
cheaper arm (docs/COMPARE.md, "equal compute").

The points are whole FLOPs, rounded down, so the last one never lies past the cheapest arm's end. A ladder is refused:
its rungs differ in size by design and are compared rung by rung, so one grid across them would put most points
beyond the small rungs' reach.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gptlab.errors import ConfigError

KEY = "train.eval_flops"
MAX_POINTS = 100  # evals a step either side of each point: 2 x this many evals at most


@dataclass(frozen=True)
class ArmCost:
    """One arm as gptlab-train will cost it: FLOPs per optimizer step and the steps it trains."""

    arm: str
    flops_per_step: float
    max_steps: int

    @property
    def total(self) -> float:
        return self.flops_per_step * self.max_steps


def parse_points(value) -> int:
    """--equal-flops N / equal_flops: N as an int in [1, MAX_POINTS]; one line naming the allowed values else."""
    try:
        points = int(str(value))
    except ValueError:
        points = 0
    if str(value).strip() != str(points) or not 1 <= points <= MAX_POINTS:
        raise ConfigError(
            f"--equal-flops {value!r}: allowed: a whole number of shared FLOPs points from 1 to {MAX_POINTS}"
        )
    return points


def arm_cost(arm: str, overrides: list[str]) -> ArmCost:
    """What one arm's runs will cost per step, from the config they compose (seed 0's: the seed changes no size)."""
    from gptlab.config.build import build_cost_model, build_data, compose
    from gptlab.costs.report import train_flops_per_token

    try:
        cfg = compose(overrides)
        data = build_data(cfg, int(cfg.model.block_size))
        model = build_cost_model(cfg, data.vocab_size)
    except ConfigError as err:
        raise ConfigError(f"--equal-flops: arm '{arm}' cannot be costed: {err}") from None
    per_token = float(train_flops_per_token(model, data.seq_len))
    return ArmCost(arm, int(cfg.train.batch_size) * data.seq_len * per_token, int(cfg.train.max_steps))


def grid(costs: list[ArmCost], points: int) -> list[int]:
    """N equally spaced cumulative-FLOPs points up to the smallest arm's total, whole FLOPs rounded down."""
    top = min(c.total for c in costs)
    return [int(top * k // points) for k in range(1, points + 1)]


def plan(
    arms: dict[str, list[str]], points: int, cost: Callable[[str, list[str]], ArmCost] = arm_cost
) -> tuple[str, str]:
    """(the override every run gets, the note that says what was planned) for these arms' full overrides."""
    for arm, overrides in arms.items():
        if any(o.lstrip("+~").split("=", 1)[0] == KEY for o in overrides):
            raise ConfigError(f"--equal-flops: arm '{arm}' sets {KEY} itself; drop one of the two")
    costs = [cost(arm, overrides) for arm, overrides in arms.items()]
    values = grid(costs, points)
    if values[0] < 1:
        raise ConfigError("--equal-flops: the cheapest arm trains too few FLOPs for a grid (train.max_steps is 0?)")
    cheapest = min(costs, key=lambda c: c.total)
    per_step = ", ".join(f"{c.arm} {c.flops_per_step:.3g}" for c in costs)
    note = (
        f"note: equal FLOPs: every arm evaluated at {points} shared points of cumulative training FLOPs up to "
        f"{values[-1]:.4g}, the budget of the cheapest arm ({cheapest.arm}, {cheapest.max_steps} steps); FLOPs per "
        f"step: {per_step}"
    )
    return f"{KEY}=[{','.join(str(v) for v in values)}]", note
