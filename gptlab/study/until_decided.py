"""Seeds until decided, run: plan the looks, launch each look's runs, look, record, and add seeds only to the arms
still open, until each is decided or the plan's cap is reached.

`gptlab-sweep NAME --until-decided --max-seeds N` calls plan_for() before anything is written and run() after; the
one look and the record of looks are compare/studies/until_decided.py's, the group-sequential plan
compare/statistics/sequential.py's, the pending runs sweep/plan.py's. The caller launches (and prints) a look's runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gptlab.compare.statistics.sequential import Look, Plan, plan
from gptlab.compare.studies.until_decided import RECORD_FILE, look, read_record, write_record
from gptlab.errors import ConfigError
from gptlab.sweep.plan import Pending, pending, write_plan
from gptlab.sweep.spec import Sweep


@dataclass
class Outcome:
    """What run() did: the looks taken, the runs of the look that failed (the plan stopped there), the record."""

    looks: list[dict[str, Look]]
    failed: list[str]  # empty unless a look's runs failed: no look was taken on them
    record: Path | None  # until_decided.json once the plan ended; None for a dry run or a stopped plan


def baseline(sweep: Sweep) -> str:
    """The arm every other is decided against: the sweep's first."""
    return next(iter(sweep.spec["arms"]))


def plan_for(sweep: Sweep, max_seeds: int, seed_step: int | None = None, spending: str | None = None) -> Plan:
    """The sweep's group-sequential plan (first look at its own seeds; `seed_step` 1 and O'Brien-Fleming spending
    unless given), or a ConfigError for a sweep it cannot run or a sweep dir whose until_decided.json records another
    plan (other seed counts or seed values, spending, alpha or baseline): looks replayed over the same runs under a
    second plan would push the false-decision rate above alpha (0.068-0.072 for a rerun with a larger --max-seeds),
    so only the recorded plan continues there. Writes nothing."""
    if sweep.command != "train":
        raise ConfigError(f"a {sweep.command} sweep has no val loss to decide on; --until-decided runs training sweeps")
    if len(sweep.spec["arms"]) < 2:
        raise ConfigError("the sweep needs a baseline (its first arm) and at least one other arm")
    step, spend = 1 if seed_step is None else seed_step, "obrien_fleming" if spending is None else spending
    found = plan(len(sweep.seeds), step, max_seeds, spending=spend)
    differs = _recorded_plan_differs(sweep.sweep_dir, found, baseline(sweep), seeds_in_order(sweep, found))
    if differs:
        raise ConfigError(differs)
    return found


def stray_flag(max_seeds: int | None, seed_step: int | None, spending: str | None) -> str | None:
    """The first --until-decided flag given without --until-decided, in words (it would be ignored); None if none."""
    given = [flag for flag, v in (("--max-seeds", max_seeds), ("--seed-step", seed_step), ("--spending", spending))
             if v is not None]  # fmt: skip
    return f"{given[0]} needs --until-decided (without it the sweep runs exactly --seeds)" if given else None


def _plan_flags(seeds: list[int], spending: str, values: list[int] | None) -> dict[str, str]:
    """A plan's seeds per look (the first look's seed values when known) and spending as the flags that give them."""
    first = {"--seeds": ",".join(str(v) for v in values[: seeds[0]])} if values else {"--seeds count": str(seeds[0])}
    step = {"--seed-step": str(seeds[1] - seeds[0])} if len(seeds) > 1 else {}
    return {**first, **step, "--max-seeds": str(seeds[-1]), "--spending": spending}


def _recorded_plan_differs(sweep_dir: Path, wanted: Plan, base: str, values: list[int]) -> str | None:
    """What differs between the plan of the sweep dir's until_decided.json and `wanted` over seed `values` (and what
    is allowed), in words; None when the dir has no record or records this plan. A damaged record raises."""
    doc = read_record(sweep_dir)
    if doc is None:
        return None
    was, recorded_base, recorded = doc["plan"], doc["baseline"], doc.get("seed_values")
    same_values = recorded is None or recorded == values  # older records keep seed counts only
    old = _plan_flags(was["seeds"], was["spending"], recorded)
    now = _plan_flags(list(wanted.seeds), wanted.spending, values if recorded is not None else None)
    diffs = [f"{flag} {now.get(flag, '-')} (recorded: {old.get(flag, '-')})" for flag in dict.fromkeys([*old, *now])
             if old.get(flag) != now.get(flag)]  # fmt: skip
    diffs += [] if same_values or diffs else [f"seeds {values} (recorded: {recorded})"]
    diffs += [f"alpha {wanted.alpha:g} (recorded: {was['alpha']:g})"] if was["alpha"] != wanted.alpha else []
    diffs += [f"baseline '{base}' (recorded: '{recorded_base}')"] if recorded_base != base else []
    if not diffs:
        return None  # the same plan: it continues
    flags = ", ".join(f"{flag} {value}" for flag, value in old.items())
    return (
        f"{sweep_dir / RECORD_FILE} records looks of another plan: {', '.join(diffs)}; looks replayed under a second "
        f"plan push the false-decision rate above alpha; allowed: the recorded plan ({flags}) to continue it, or a "
        "new --out"
    )


def seeds_in_order(sweep: Sweep, design: Plan) -> list[int]:
    """The sweep's own seeds, then the next ones after them up to the plan's cap: look k runs the first n_k."""
    extra = design.seeds[-1] - len(sweep.seeds)
    return sweep.seeds + list(range(max(sweep.seeds) + 1, max(sweep.seeds) + 1 + extra))


def run(
    sweep: Sweep,
    design: Plan,
    launch: Callable[[Pending], list[str]],
    *,
    dry_run: bool = False,
    on_look: Callable[[dict[str, Look]], None] | None = None,
) -> Outcome:
    """Run the sweep's seeds (its definition recorded in its dir: sweep/spec.py record_definition), then at each look
    of `design` add seeds only to the arms still undecided (and the baseline) until each is decided or the cap is
    reached. `launch` starts a look's pending runs and returns the failed ones' names; `on_look` hears each look's
    decisions as they come. A dry run plans (and launches) the first look only and writes nothing; failed runs stop
    the plan before their look. Raises ConfigError for runs that cannot be planned or read back."""
    base, seeds = baseline(sweep), seeds_in_order(sweep, design)
    open_arms: list[str] = list(sweep.spec["arms"])[1:]
    taken: list[dict[str, Look]] = []
    if not dry_run and read_record(sweep.sweep_dir) is None:  # on record before any run: only it may continue
        write_record(sweep.sweep_dir, design, base, [], finished=False, seeds=seeds)
    for k, n in enumerate(design.seeds):
        spec = {**sweep.spec, "arms": {a: sweep.spec["arms"][a] for a in [base, *open_arms]}}
        todo = pending(sweep.name, spec, seeds[:n], sweep.sweep_dir, sweep.extra)
        if todo.runs and not dry_run:
            write_plan(sweep.sweep_dir, todo.runs)
        failed = launch(todo)
        if dry_run or failed:
            return Outcome(taken, failed, None)  # a dry run: the first look's runs; the rest depend on what it decides
        found = look(sweep.sweep_dir, design, k, base, open_arms, seeds[:n])
        taken.append(found)
        write_record(sweep.sweep_dir, design, base, taken, finished=False, seeds=seeds)
        if on_look is not None:
            on_look(found)
        open_arms = [a for a in open_arms if not found[a].stop]
        if not open_arms:
            break
    return Outcome(taken, [], write_record(sweep.sweep_dir, design, base, taken, seeds=seeds))
