"""Seeds until decided: one look of a group-sequential design over a sweep dir, and the record of the looks taken.

`gptlab-sweep NAME --until-decided --max-seeds N` runs every arm at the sweep's seeds, then at each look of a
compare/statistics/sequential.py plan reads the finished runs here (through compare/reading/runs.py and the
like-with-like check), decides each arm still open against the baseline on its final val loss, and adds seeds only
to the arms still undecided (and the baseline) until each is decided or the cap is reached. The looks are recorded
in <sweep dir>/until_decided.json (with the seed values the looks take), from before the first launch on, so a plan
stopped half-way is on record too; it is read back checked, and a damaged one is refused in one line, never dropped.
gptlab-compare reports how many were taken and each arm's sequential decision, since a plain Welch p on data that
grew until it was decided would overstate the evidence.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gptlab.compare.reading.like import check_like
from gptlab.compare.reading.runs import Run, load_run
from gptlab.compare.statistics.sequential import SPENDINGS, Look, Plan, decide
from gptlab.errors import ConfigError
from gptlab.sweep.layout import seed_part
from gptlab.util.io import atomic_write_text, strict_json
from gptlab.util.stored import Check, read_json

RECORD_FILE = "until_decided.json"  # in the sweep dir
FIX = "restore the file gptlab-sweep wrote, or rerun the sweep with --until-decided into a new --out"


def _final(run: Run) -> float:
    value = run.summary.get("final_val_loss")
    if run.summary.get("status") != "finished" or not isinstance(value, (int, float)):
        raise ConfigError(f"{run.path}: not a finished run with a final val loss; rerun the sweep to finish it")
    return float(value)


def look(sweep_dir: Path, design: Plan, k: int, base: str, arms: list[str], seeds: list[int]) -> dict[str, Look]:
    """Look k: each open arm's final val losses over `seeds` against the baseline arm's, decided by the plan."""
    runs = {arm: [load_run(sweep_dir / arm / seed_part(s)) for s in seeds] for arm in [base, *arms]}
    check_like([r for per in runs.values() for r in per])
    base_values = [_final(r) for r in runs[base]]
    return {arm: decide(design, k, [_final(r) for r in runs[arm]], base_values) for arm in arms}


def write_record(
    sweep_dir: Path,
    design: Plan,
    base: str,
    looks: list[dict[str, Look]],
    finished: bool = True,
    seeds: Sequence[int] | None = None,
) -> Path:
    """until_decided.json: the plan, the seed values in the order the looks take them (`seeds`), per look each open
    arm's test, and whether the plan ran to its end (written before the first launch and after every look, so an
    interrupted plan is on record and only it may continue); a p that is not finite is written as null."""
    doc = {
        "baseline": base,
        "plan": {**asdict(design), "looks": design.looks},
        **({"seed_values": list(seeds)} if seeds is not None else {}),
        "looks": [{arm: asdict(found) for arm, found in taken.items()} for taken in looks],
        "finished": finished,
    }
    path = sweep_dir / RECORD_FILE
    atomic_write_text(path, json.dumps(strict_json(doc), indent=1) + "\n")
    return path


def read_record(sweep_dir: Path) -> dict[str, Any] | None:
    """The sweep dir's until_decided.json, checked; None when it has none. A damaged or hand-edited one raises a
    one-line ConfigError naming the file and the fix (gptlab/util/stored.py), never read as missing."""
    path = sweep_dir / RECORD_FILE
    if not path.exists():
        return None
    check = Check(path, FIX)
    doc = check.mapping("the record", read_json(path, FIX))
    check.text("baseline", doc.get("baseline"))
    check.flag("finished", doc.get("finished"))
    counts = _check_plan(check, check.mapping("plan", doc.get("plan")))
    if "seed_values" in doc:  # records written before seed values were kept have none
        values = doc["seed_values"]
        if not isinstance(values, list) or len(values) != counts[-1] or len(set(map(str, values))) != len(values):
            raise check.fail(f"seed_values: expected {counts[-1]} distinct seeds, got {values!r}")
        for i, seed in enumerate(values):
            check.number(f"seed_values[{i}]", seed, "", int)
    looks = doc.get("looks")
    if not isinstance(looks, list) or len(looks) > len(counts):
        raise check.fail(f"looks: expected a list of at most {len(counts)} looks, got {looks!r}")
    for k, taken in enumerate(looks):
        for arm, found in check.mapping(f"looks[{k}]", taken).items():
            _check_look(check, f"looks[{k}].{arm}", check.mapping(f"looks[{k}].{arm}", found), k, counts[k])
    return doc


def _check_plan(check: Check, design: dict[str, Any]) -> list[int]:
    """The recorded plan's fields that are read back, checked; its seeds per look."""
    counts = design.get("seeds")
    if not isinstance(counts, list) or not counts:
        raise check.fail(f"plan.seeds: expected a list of seeds per look, got {counts!r}")
    for i, n in enumerate(counts):
        check.number(f"plan.seeds[{i}]", n, ">= 1", int)
    if any(a >= b for a, b in zip(counts, counts[1:])):
        raise check.fail(f"plan.seeds={counts}: must increase from look to look")
    thresholds = design.get("thresholds")
    if not isinstance(thresholds, list) or len(thresholds) != len(counts):
        raise check.fail(f"plan.thresholds: expected {len(counts)} thresholds, got {thresholds!r}")
    for i, p in enumerate(thresholds):
        check.number(f"plan.thresholds[{i}]", p, "[0, 1]")
    check.number("plan.alpha", design.get("alpha"), "(0, 1)")
    check.one_of("plan.spending", design.get("spending"), SPENDINGS)
    if design.get("looks") != len(counts):
        raise check.fail(f"plan.looks={design.get('looks')!r}: must be {len(counts)}, the looks of plan.seeds")
    return counts


def _check_look(check: Check, key: str, found: dict[str, Any], k: int, seeds: int) -> None:
    """One recorded test of one arm at look k (a Look as its JSON dict), checked."""
    for name, want in (("look", k), ("seeds", seeds)):
        if found.get(name) != want or isinstance(found.get(name), bool):
            raise check.fail(f"{key}.{name}={found.get(name)!r}: must be {want}")
    check.number(f"{key}.diff", found.get("diff"), "", null=True)
    check.number(f"{key}.p", found.get("p"), "[0, 1]", null=True)
    check.number(f"{key}.threshold", found.get("threshold"), "[0, 1]")
    check.flag(f"{key}.decided", found.get("decided"))
    check.one_of(f"{key}.direction", found.get("direction"), (-1, 0, 1))
    check.flag(f"{key}.final", found.get("final"))


def seeds_run(sweep_dir: Path) -> dict[str, list[int]]:
    """The seeds each arm ran at the looks the sweep dir's record took: an arm's at the last look it was open at, the
    baseline's at every look (what `gptlab-sweep status` lists beyond sweep.yaml's seeds); empty without a record or
    for one that keeps no seed values."""
    doc = read_record(sweep_dir)
    values = doc.get("seed_values") if doc is not None else None
    if doc is None or values is None:
        return {}
    ran: dict[str, int] = {}
    for k, taken in enumerate(doc["looks"]):
        ran.update({arm: doc["plan"]["seeds"][k] for arm in [doc["baseline"], *taken]})
    return {arm: values[:n] for arm, n in ran.items()}


def planned_baseline(sweep_dir: Path, doc: dict[str, Any], runs: Sequence[Run]) -> str | None:
    """The folder of the record's baseline arm when one of `runs` is in it: gptlab-compare's default --baseline for an
    until-decided sweep, so that its table and its looks are against one arm; None otherwise."""
    arm = (sweep_dir / doc["baseline"]).resolve()
    return str(arm) if any(arm in r.path.resolve().parents for r in runs) else None
