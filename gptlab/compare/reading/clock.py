"""The comparison's clock: which recorded time the time-based readings (val loss at equal time, time to target, the
loss-vs-time plot) put on their x-axis.

`train_s` is each step's measured time summed (on CUDA the GPU's time between the step's marks): evals, probes,
checkpoints and the diagnostics' own time fall outside it. `wall_s` holds all of them, so two runs of one model that
evaluate or probe differently read as different speeds on it. Compare uses training time when every run recorded it
at every step, and otherwise wall time for every run (never a mix of the two), with a note naming a run that lacks it:
runs written before train_s was kept, or resumed from a checkpoint written before it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gptlab.compare.reading.runs import Run
from gptlab.util.note import Note, note

TRAIN = "train_s"
WALL = "wall_s"
NAMES = {TRAIN: "training time", WALL: "wall time"}


@dataclass(frozen=True)
class Clock:
    """`key`: the row key read as time (train_s or wall_s); `note`: why it is wall time, when it is."""

    key: str
    note: Note | None = None

    @property
    def name(self) -> str:
        """The clock in words: `training time` or `wall time`."""
        return NAMES[self.key]


def has_training_clock(run: Run) -> bool:
    """Every row after the start (step > 0) recorded train_s."""
    rows = [rec for step, rec in run.by_step.items() if step > 0]
    return bool(rows) and all(rec.get(TRAIN) is not None for rec in rows)


def clock_of(runs: list[Run]) -> Clock:
    """Training time when every run recorded it throughout; else wall time for all, with the note that says so."""
    lacking = [run for run in runs if not has_training_clock(run)]
    if not lacking:
        return Clock(TRAIN)
    more = f" and {len(lacking) - 1} more" if len(lacking) > 1 else ""
    return Clock(
        WALL,
        note(
            f"note: time is wall time (evals, probes and checkpoints included), not training time: {lacking[0].path}"
            f"{more} recorded no train_s at some step (written before it was kept, or resumed from such a checkpoint)",
            subject=str(lacking[0].path),
        ),
    )
