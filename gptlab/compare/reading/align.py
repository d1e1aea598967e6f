"""The point every run is compared at: one eval each, at an equal step, or at equal tokens when the arms differ in
tokens per step (batch size).

- every run trains on the same tokens per step (or one is unrecorded): the largest step at which every run has a
  val/loss (or --step);
- the runs differ in tokens per step: the largest number of tokens (step × tokens per step) at which every run has a
  val/loss, each run at its own step; with none such, or with --step, the runs are compared at an equal step and a
  warning says that they saw different numbers of tokens there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gptlab.compare.reading.like import tokens_per_step
from gptlab.compare.reading.runs import Run
from gptlab.errors import ConfigError
from gptlab.util.note import Note, warning


@dataclass(frozen=True)
class Point:
    """Where the runs are compared: by "step" (value = the step) or "tokens" (value = tokens seen); steps: run dir ->
    the step that run is compared at."""

    by: str
    value: int
    steps: dict[Path, int]

    def step_of(self, run: Run) -> int:
        """The step this run is compared at."""
        return self.steps[run.path]

    def describe(self) -> str:
        """`step 100` or `12,800 tokens`."""
        return f"step {self.value}" if self.by == "step" else f"{self.value:,} tokens"


def _span(run: Run) -> str:
    steps = run.val_steps()
    return f"{steps[0]}..{steps[-1]}" if steps else "none"


def common_step(runs: list[Run], step: int | None) -> int:
    """Largest step with val/loss in every run, or the requested step if every run has it."""
    if step is not None:
        for run in runs:
            if step not in run.val_steps():
                have = run.val_steps()
                span = f"val/loss steps {have[0]}..{have[-1]}" if have else "no val/loss"
                raise ConfigError(f"--step {step}: run {run.path} has no val/loss at that step ({span})")
        return step
    shared = set(runs[0].val_steps())
    for run in runs[1:]:
        shared &= set(run.val_steps())
    if not shared:
        root = os.path.commonpath([str(r.path) for r in runs])
        spans = ", ".join(f"{os.path.relpath(r.path, root)}: {_span(r)}" for r in runs[:4])
        spans += ", ..." if len(runs) > 4 else ""
        raise ConfigError(f"no common step: the runs share no step with val/loss ({spans})")
    return max(shared)


def tokens_at(run: Run, step: int) -> int | None:
    """Tokens the run has trained on by `step` (step × tokens per step); None when its tokens per step are unknown."""
    per = tokens_per_step(run)
    return step * per if per is not None else None


def _at_step(runs: list[Run], step: int) -> Point:
    return Point("step", step, {r.path: step for r in runs})


def _unequal(runs: list[Run], step: int, why: str) -> Note:
    seen = sorted({tokens_at(r, step) or 0 for r in runs})
    return warning(
        f"the runs differ in tokens per step and are compared at equal step {step} ({why}): there they have seen "
        f"{', '.join(f'{t:,}' for t in seen)} tokens, so a val loss difference mixes the arm with the amount of data"
    )


def align(runs: list[Run], step: int | None = None) -> tuple[Point, list[Note]]:
    """(the point to compare at, warnings): see the module docstring."""
    per = {tokens_per_step(r) for r in runs}
    if len(per) <= 1 or None in per:
        return _at_step(runs, common_step(runs, step)), []
    if step is not None:
        return _at_step(runs, common_step(runs, step)), [_unequal(runs, step, "--step was given")]
    by_tokens = [{tokens_at(r, s): s for s in r.val_steps()} for r in runs]
    shared = set(by_tokens[0])
    for seen in by_tokens[1:]:
        shared &= set(seen)
    if shared:
        tokens = max(t for t in shared if t is not None)
        return Point("tokens", tokens, {r.path: seen[tokens] for r, seen in zip(runs, by_tokens)}), []
    at = common_step(runs, None)
    return _at_step(runs, at), [_unequal(runs, at, "no eval point has equal tokens in every run")]
