"""Group runs that differ only by seed, label groups by what differs from the baseline, pick the baseline."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptlab.compare.reading.runs import Run, common_root, where
from gptlab.errors import ConfigError
from gptlab.state.layout import ADDED_KEYS
from gptlab.util.note import Note, warning
from gptlab.util.tree import flatten

# Keys that vary between seeds of one configuration: runs differing only here form one group.
SEED_KEYS = frozenset({"seed", "data_seed"})
# Run bookkeeping: where/how a run was stored, resumed or logged says nothing about the model or data.
# `sweep` names the sweep; `sample`/`profile` only act after or beside training.
IGNORED_TOP = frozenset(
    {"paths", "logger", "hydra", "wandb", "name", "run_name", "tags", "notes", "sweep", "arm", "sample", "profile"}
    | {"probes"}  # capability probes only observe (compare.probes checks their sets apart)
)
# Keys that only log, checkpoint or observe: each one gptlab/config/settings.py holds is `curve=False` there, which
# compare may not import; tests/compare/test_ignored_keys.py ties the two lists.
IGNORED_KEYS = frozenset(
    {
        "train.resume",
        "train.log_interval",
        "train.ckpt_interval",  # diagnostics only observe:
        "train.diagnostics",
        "train.spike_factor",
        "train.spike_window",
        "train.spike_dump",
        "train.detect_anomaly",
        "data.val_sets",  # extra validation sets only observe (tables.val_sets pools each set only over equal ones)
    }
)
IGNORED_CHOICES = frozenset({"logger", "launcher", "probes"})
# Data-loader knobs change speed, not the task.
_LOADER_KEYS = frozenset({"num_workers", "num_proc", "pin_memory", "prefetch_factor", "persistent_workers", "verify"})
# data.* keys that set how the model reads the same windows, not which windows: an arm, never a task difference
# (data.doc_mask: x, y and the validation windows are the same with and without the document mask)
_ARM_DATA_KEYS = frozenset({"data.doc_mask"})
_MISSING = object()


def _path_like(key: str) -> bool:
    last = key.rsplit(".", 1)[-1]
    return last in ("dir", "path", "root", "cache") or last.endswith(("_dir", "_path", "_root"))


def is_bookkeeping(key: str) -> bool:
    """True for keys that never make two runs different experiments (seeds excluded separately)."""
    return key.split(".", 1)[0] in IGNORED_TOP or key in IGNORED_KEYS or _path_like(key)


def show(value: Any) -> str:
    """Config value as a user would type it in an override (`true`, `null`, `3`, `[1, 2]`)."""
    if value is _MISSING:
        return "unset"
    if isinstance(value, (bool, type(None), list, dict)):
        return json.dumps(value)
    return str(value)


def _canon(value: Any) -> str:
    return "\0missing" if value is _MISSING else json.dumps(value, sort_keys=True, default=str)


def override_keys(overrides: list[str]) -> set[str]:
    """Keys named by Hydra override strings: `+a.b=1` -> `a.b`, `attention=gqa` -> `attention`."""
    return {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o or o.startswith("~")}


@dataclass
class Group:
    """Runs sharing one configuration up to seeds; `label` is set once the baseline is known."""

    runs: list[Run]
    choices: dict[str, str]
    leaves: dict[str, Any]
    overridden: set[str] = field(default_factory=set)
    label: str = ""

    def value(self, key: str) -> str | None:
        """Display value of a choice (`attention`) or leaf (`mlp.ratio`) key; None when absent."""
        if key in self.choices:
            return self.choices[key]
        return show(self.leaves[key]) if key in self.leaves else None


def _signature(run: Run) -> tuple[dict[str, str], dict[str, Any]]:
    choices = {k: v for k, v in run.choices.items() if k not in IGNORED_CHOICES}
    flat = flatten(run.config, empty_as_leaf=True)
    leaves = {k: v for k, v in flat.items() if k not in SEED_KEYS and not is_bookkeeping(k)}
    # a key added after runs were written reads as the value that trains as the code did before it
    leaves.update({k: v for k, v in ADDED_KEYS.items() if k not in leaves and _section(k) in run.config})
    return choices, leaves


def _section(key: str) -> str:
    return key.split(".", 1)[0]


def group_runs(runs: list[Run]) -> list[Group]:
    """Runs with equal choices and equal non-seed, non-bookkeeping config, in first-seen order."""
    groups: dict[tuple, Group] = {}
    for run in runs:
        choices, leaves = _signature(run)
        key = (tuple(sorted(choices.items())), tuple(sorted((k, _canon(v)) for k, v in leaves.items())))
        grp = groups.setdefault(key, Group([], choices, leaves))
        grp.runs.append(run)
        grp.overridden |= override_keys(run.overrides)
    return list(groups.values())


def one_run_per_seed(groups: list[Group]) -> list[Note]:
    """Keep one run per seed in every group (in place); one warning per run left out.

    A configuration run again with the same seeds (the baseline in two sweep dirs on one command line) is a
    replay, not a new sample: counted twice its losses agree (on CPU to the bit) and the test reads them as no
    seed noise at all. Of the replays the one with the most val/loss evals is kept, ties to the first found, as
    for copies (reading/identity.dedupe); a copy has already been counted once there.
    """
    root = common_root([r for g in groups for r in g.runs])
    warnings = []
    for g in groups:
        by_seed: dict[str, list[Run]] = {}
        for run in g.runs:
            flat = flatten(run.config, empty_as_leaf=True)
            by_seed.setdefault(_canon([flat.get(k, _MISSING) for k in sorted(SEED_KEYS)]), []).append(run)
        if all(len(same) == 1 for same in by_seed.values()):
            continue
        kept = [max(same, key=lambda r: len(r.val_steps())) for same in by_seed.values()]
        for same, best in zip(by_seed.values(), kept):
            seeds = ", ".join(f"{k} {show(flatten(best.config).get(k, _MISSING))}" for k in sorted(SEED_KEYS))
            for run in same:
                if run is not best:
                    warnings.append(
                        warning(
                            f"{where(run, root)} repeats {where(best, root)}'s config and seeds ({seeds}): a replay "
                            f"is not a new sample; counted once, as {where(best, root)}",
                            subject=where(run, root),
                        )
                    )
        g.runs = [r for r in g.runs if any(r is k for k in kept)]
    return warnings


def diff_items(g: Group, base: Group, hide_implied: bool = True, name_values: bool = True) -> list[tuple[str, str]]:
    """(key, g's value) where g differs from base: choices first, then leaves not implied by a changed choice
    (`attention=gqa, attention.n_kv_head=2`: every value that differs is named; with name_values False every leaf
    of a changed choice counts as implied: the choices alone, as the default baseline and --threshold count)."""
    out = [
        (k, g.choices.get(k, "none")) for k in {**g.choices, **base.choices} if g.choices.get(k) != base.choices.get(k)
    ]
    changed = {k for k, _ in out}
    for key in sorted(set(g.leaves) | set(base.leaves)):
        mine, theirs = g.leaves.get(key, _MISSING), base.leaves.get(key, _MISSING)
        if _canon(mine) == _canon(theirs):
            continue
        # A leaf that differs because its group's choice changed is implied by `group=choice` when it is the
        # choice's own (one side lacks it, e.g. swiglu's multiple_of), unset (mha's n_kv_head) or its bookkeeping;
        # a value both choices set differently (gqa's n_kv_head=2 against mqa's 1) is shown.
        implied = not name_values or _implied(key, mine, theirs)
        if hide_implied and key.split(".", 1)[0] in changed and key not in g.overridden and implied:
            continue
        out.append((key, show(mine)))
    return out


def _implied(key: str, mine: Any, theirs: Any) -> bool:
    """True for a leaf of a changed choice that the choice's name already says (see diff_items)."""
    leaf = key.rsplit(".", 1)[-1]
    return mine is _MISSING or theirs is _MISSING or mine is None or leaf in ("_target_", "name") or leaf[0] == "_"


def _fmt(items: list[tuple[str, str]]) -> str:
    return ", ".join(f"{k}={v}" for k, v in items)


def assign_labels(groups: list[Group], base: Group) -> None:
    """Label every group by its differences from base; base by how it differs from the others."""
    base_items: dict[str, str] = {}
    others = [g for g in groups if g is not base]
    for g in others:
        g.label = _fmt(diff_items(g, base))
        base_items.update(diff_items(base, g))
    fixed = {}
    for g in others:
        # Missing overrides (older runs) can hide the leaf that tells two groups apart: add it back.
        twins = [h for h in others if h is not g and h.label == g.label]
        if twins or not g.label:
            items = dict(diff_items(g, base))
            for h in twins or [base]:
                items.update(diff_items(g, h, hide_implied=False))
            fixed[id(g)] = _fmt(list(items.items()))
    for g in others:
        g.label = fixed.get(id(g), g.label)
    base.label = _fmt(list(base_items.items())) or "baseline"


def default_baseline(groups: list[Group]) -> Group:
    """Group with the fewest differences from all others summed; ties go to the group of the first run."""

    def score(g: Group) -> int:
        return sum(len(diff_items(g, h, name_values=False)) for h in groups if h is not g)

    return min(groups, key=score)  # min keeps the earliest on ties


def matches(g: Group, item: str) -> bool:
    """True when g's choice or leaf named by `key=value` has that value (as text or as a number)."""
    key, _, want = item.partition("=")
    have = g.value(key.strip())
    if have is None:
        return False
    want = want.strip()
    if have == want:
        return True
    try:
        return float(have) == float(want)
    except ValueError:
        return False


def find_baseline(groups: list[Group], spec: str | None) -> Group:
    """Resolve --baseline (a run dir, the folder of one arm's run dirs, or `group=choice`/`key=value` items joined by
    commas) to one group: for a folder, the first group with a run in it."""
    if spec is None:
        return default_baseline(groups)
    if Path(spec).exists():
        target = Path(spec).resolve()
        for g in groups:
            if any(r.path == target or target in r.path.parents for r in g.runs):
                return g
        raise ConfigError(f"--baseline '{spec}' is not one of the compared run directories")
    assign_labels(groups, default_baseline(groups))
    items = [s for s in (p.strip() for p in spec.split(",")) if s]
    hits = [g for g in groups if items and all("=" in i and matches(g, i) for i in items)]
    hits = hits or [g for g in groups if g.label == spec]  # a label whose values hold commas
    if len(hits) == 1:
        return hits[0]
    if hits:  # never one of them silently: the label that matched exactly is relative to another baseline
        named = "; ".join(_fmt(_among(g, hits)) or g.label for g in hits)
        raise ConfigError(
            f"--baseline '{spec}' matches {len(hits)} groups ({named}); add what tells them apart, e.g. "
            f"--baseline '{spec}, {_fmt(_among(hits[0], hits)[:1])}'"
        )
    labels = "; ".join(g.label for g in groups)
    raise ConfigError(f"--baseline '{spec}' matches no group; labels: {labels}")


def _among(g: Group, hits: list[Group]) -> list[tuple[str, str]]:
    """(key, g's value) for each key whose value differs among `hits`: what tells g apart from the others."""
    items: dict[str, str] = {}
    for h in hits:
        if h is not g:
            items.update(diff_items(g, h, hide_implied=False))
    return sorted(items.items())


def _task_keys(run: Run) -> dict[str, str]:
    """What defines the task: the data choice, data.* settings and any tokenizer setting (not loader knobs, nor
    bookkeeping such as data.val_sets, which only observe)."""
    flat = flatten(run.config, empty_as_leaf=True)
    keys = {
        k: show(v)
        for k, v in flat.items()
        if (k.startswith("data.") or "tokenizer" in k)
        and not is_bookkeeping(k)
        and k.rsplit(".", 1)[-1] not in _LOADER_KEYS
        and k not in _ARM_DATA_KEYS
    }
    if "data" in run.choices:
        keys["data"] = run.choices["data"]
    return keys


def check_same_task(runs: list[Run]) -> None:
    """Refuse to compare runs of different tasks (data/tokenizer, or accuracy vs language-model runs)."""
    first, ref = runs[0], _task_keys(runs[0])
    first_acc = any("val/acc" in r for r in first.by_step.values())
    for run in runs[1:]:
        keys = _task_keys(run)
        for key in sorted(set(ref) | set(keys)):
            if ref.get(key) != keys.get(key):
                raise ConfigError(
                    f"mixed tasks: {key} is {ref.get(key, 'unset')} in {first.path} but {keys.get(key, 'unset')} "
                    f"in {run.path}; compare runs of one data/tokenizer setup"
                )
        if any("val/acc" in r for r in run.by_step.values()) != first_acc:
            has, lacks = (first, run) if first_acc else (run, first)
            raise ConfigError(
                f"mixed tasks: {has.path} reports val/acc but {lacks.path} does not "
                "(e.g. data=assoc_recall vs a language-model run)"
            )
