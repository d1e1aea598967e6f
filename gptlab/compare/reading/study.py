"""Several sweeps are one study only when they were run alike; else their runs are split, never pooled in one table.

A run's sweep is the nearest folder above it with a sweep.yaml (gptlab-sweep's), else the `sweep` name in its config;
runs of no sweep (run dirs given one by one) are the user's own choice of arms, and a sweep's own arms may differ in
anything (they are its design). Between sweeps, each study key must agree: the budget (train.max_steps, tokens per
step), the schedule (its choice and every schedule.* key), the eval grid (train.eval_interval, train.eval_flops), the
code version and the machine (reading/like.py `code`, `machine`: provenance.json). A sweep's value of a key is the set
of values its runs have; two sweeps agree on it when the sets are equal, or, for the code and the machine, when one
side recorded none (older runs). Validation sets are checked run by run (like.check_like), not here.

Sweeps that do not all agree are split into parts, each a class of sweeps that agree (in the order first met), as
--split-by splits: one table per part, each with a note saying what differs and where. Under --split-by a part that
still holds sweeps run differently is refused in one line naming the key to split by as well.
"""

from __future__ import annotations

import os
from pathlib import Path

from gptlab.compare.reading.like import CODE, MACHINE, UNSET, Part, value
from gptlab.compare.reading.runs import Run
from gptlab.errors import ConfigError
from gptlab.sweep.layout import SWEEP_FILE
from gptlab.util.note import Note, warning
from gptlab.util.tree import flatten

FIXED_KEYS = (
    "train.max_steps",
    "tokens_per_step",
    "schedule",
    "train.eval_interval",
    "train.eval_flops",
    CODE,
    MACHINE,
)
UNRECORDED_AGREES = (CODE, MACHINE)  # a run without provenance.json says nothing about these
Values = dict[str, frozenset[str]]


def sweep_of(run: Run) -> str | None:
    """The sweep a run belongs to: its nearest folder with a sweep.yaml, else its config's `sweep` name; None for a
    run of no sweep."""
    home = next((p for p in run.path.resolve().parents if (p / SWEEP_FILE).is_file()), None)
    if home is not None:
        return str(home)
    name = run.config.get("sweep") if isinstance(run.config, dict) else None
    return f"sweep={name}" if isinstance(name, str) and name and "${" not in name else None


def study_keys(runs: list[Run]) -> list[str]:
    """The keys sweeps must agree in: FIXED_KEYS with every schedule.* key any run has (its _target_ aside)."""
    found = {k for r in runs for k in flatten(r.config, empty_as_leaf=True) if k.startswith("schedule.")}
    schedule = sorted(k for k in found if not k.rsplit(".", 1)[-1].startswith("_"))
    at = FIXED_KEYS.index("schedule") + 1
    return [*FIXED_KEYS[:at], *schedule, *FIXED_KEYS[at:]]


def _shown(key: str, raw: str) -> str:
    """A value as a part's title shows it: an eval_flops grid by its size and last point, not every point."""
    if key != "train.eval_flops" or not raw.startswith("["):
        return raw
    points = [p for p in raw.strip("[]").split(",") if p.strip()]
    return f"{len(points)} points to {float(points[-1]):.3g}" if points else raw


def _agree(key: str, a: frozenset[str], b: frozenset[str]) -> bool:
    if key in UNRECORDED_AGREES and (a <= {UNSET} or b <= {UNSET}):
        return True
    return a == b


def _classes(sweeps: dict[str, list[Run]], keys: list[str]) -> list[list[str]]:
    """The sweeps in classes whose members agree on every key, each sweep in the first class it agrees with."""
    values = {s: {k: frozenset(value(r, k) for r in runs) for k in keys} for s, runs in sweeps.items()}
    classes: list[list[str]] = []
    for s in sweeps:
        home = next((c for c in classes if all(_agree(k, values[s][k], values[t][k]) for t in c for k in keys)), None)
        if home is None:
            classes.append([s])
        else:
            home.append(s)
    return classes


def _name(sweep: str, root: str) -> str:
    return sweep if sweep.startswith("sweep=") else os.path.relpath(sweep, root) if root else Path(sweep).name


def _differ(sweeps: dict[str, list[Run]], classes: list[list[str]], keys: list[str]) -> list[str]:
    """The keys whose values differ between the classes."""

    def seen(c: list[str], k: str) -> frozenset[str]:
        found = frozenset(value(r, k) for s in c for r in sweeps[s])
        return found - {UNSET} if k in UNRECORDED_AGREES else found

    return [k for k in keys if len({seen(c, k) for c in classes}) > 1]


def _why(sweeps: dict[str, list[Run]], classes: list[list[str]], keys: list[str]) -> str:
    """`train.max_steps: 100 in attn, mqa_match; 150 in attn_lr`, for each key that differs."""
    dirs = [s for s in sweeps if not s.startswith("sweep=")]
    root = os.path.commonpath(dirs) if len(dirs) > 1 else ""
    root = root if root != "/" else ""
    parts = []
    for k in keys:
        sides = []
        for c in classes:
            shown = sorted({_shown(k, value(r, k)) for s in c for r in sweeps[s]})
            sides.append(f"{' | '.join(shown)} in {', '.join(_name(s, root) for s in c)}")
        parts.append(f"{k}: {'; '.join(sides)}")
    return "; ".join(parts)


def _by_sweep(runs: list[Run]) -> tuple[dict[str, list[Run]], list[Run]]:
    """(the runs of each sweep, in first-seen order; the runs of no sweep)."""
    sweeps: dict[str, list[Run]] = {}
    loose = []
    for run in runs:
        found = sweep_of(run)
        if found is None:
            loose.append(run)
        else:
            sweeps.setdefault(found, []).append(run)
    return sweeps, loose


def split_study(runs: list[Run]) -> tuple[list[Part], list[str], Note | None]:
    """(the parts: one per class of sweeps run alike, each with the runs of no sweep; the keys they differ in; the
    note every part carries), or one part of every run when the sweeps are one study."""
    sweeps, loose = _by_sweep(runs)
    keys = study_keys(runs)
    classes = _classes(sweeps, keys) if len(sweeps) > 1 else [list(sweeps)]
    if len(classes) < 2:
        return [Part({}, runs)], [], None
    differ = _differ(sweeps, classes, keys)
    why = _why(sweeps, classes, differ)
    parts: list[Part] = []
    for c in classes:
        members = [r for s in c for r in sweeps[s]] + loose
        shown = {k: " | ".join(sorted({_shown(k, value(r, k)) for s in c for r in sweeps[s]})) for k in differ}
        if any(p.values == shown for p in parts):  # told apart by no value shown: by its place
            shown["study"] = str(len(parts) + 1)
        parts.append(Part(shown, [r for r in runs if any(r is m for m in members)]))
    text = (
        f"the sweeps were not run alike ({why}), so they are not one study: each part is compared on its own, never "
        "one table with verdicts across them"
    )
    return parts, differ, warning(text, "study", "rerun the sweeps alike to compare them in one table")


def check_parts(parts: list[Part], split_by: list[str]) -> None:
    """Under --split-by: refuse (one line) a part that still holds sweeps not run alike, naming the key to add."""
    for part in parts:
        sweeps, _ = _by_sweep(part.runs)
        if len(sweeps) < 2:
            continue
        keys = [k for k in study_keys(part.runs) if k not in split_by]
        classes = _classes(sweeps, keys)
        if len(classes) > 1:
            differ = _differ(sweeps, classes, keys)
            where = f"[{part.title}] " if part.values else ""
            raise ConfigError(
                f"{where}the sweeps were not run alike ({_why(sweeps, classes, differ)}): they are not one study; "
                f"add --split-by {differ[0]}"
            )
