"""Seeds until decided in words: the plan, each look's decisions, and the report's note on the looks taken."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from gptlab.compare.render import words
from gptlab.compare.statistics.sequential import Look, Plan
from gptlab.compare.statistics.verdict import Status, Verdict

SPENDING = {"obrien_fleming": "O'Brien-Fleming", "pocock": "Pocock"}


def plan_line(design: Plan, base: str) -> str:
    """`until decided: up to 3 looks at 2, 3, 4 seeds per arm (O'Brien-Fleming spending, alpha 0.05 overall) ...`"""
    at = ", ".join(str(n) for n in design.seeds)
    thresholds = ", ".join(f"{p:.2g}" for p in design.thresholds)
    return (
        f"until decided: up to {design.looks} looks at {at} seeds per arm ({SPENDING[design.spending]} spending, "
        f"alpha {design.alpha} overall), each arm's final val loss against '{base}'; an arm is decided at a look "
        f"when Welch's p is below that look's threshold ({thresholds})"
    )


def _decision(f: dict[str, Any], base: str) -> str:
    """One look's test of one arm (a Look as its JSON dict) in words."""
    status = Status.DECIDED if f["decided"] else Status.WITHIN_NOISE
    v = Verdict("val/loss", status, f["diff"], p=f["p"], seeds=(f["seeds"], f["seeds"]))
    return words.look(v, f["threshold"], f["final"], base)


def look_lines(found: dict[str, Look], base: str) -> list[str]:
    """One line per open arm at this look."""
    return [f"look {f.look + 1} ({f.seeds} seeds): {arm}: {_decision(asdict(f), base)}" for arm, f in found.items()]


def report_lines(doc: dict[str, Any]) -> list[str]:
    """The comparison's note on a sweep run until decided: looks taken and each arm's sequential decision."""
    design, base = doc["plan"], doc["baseline"]
    last: dict[str, dict[str, Any]] = {}
    for taken in doc["looks"]:
        last.update(taken)
    arms = "; ".join(f"'{arm}' at look {f['look'] + 1}, {_decision(f, base)}" for arm, f in last.items())
    plan = f"({SPENDING.get(design['spending'], design['spending'])} spending, alpha {design['alpha']} overall)"
    welch = "The table's Welch p on these seeds ignores the looks and overstates the evidence"
    if doc.get("finished") is False:  # interrupted (or still running): an arm's last look may not be its decision
        return [
            f"note: seeds are being added until decided and the plan has not finished: {len(doc['looks'])} of up "
            f"to {design['looks']} looks taken {plan}; an arm still undecided is not final (rerun the sweep with the "
            f"same flags to continue it). The looks so far: {arms or 'none'}. {welch}."
        ]
    return [
        f"note: seeds were added until decided: {len(doc['looks'])} of up to {design['looks']} looks taken {plan}. "
        f"The sequential decisions: {arms}. {welch}: read the decisions here."
    ]


def baseline_note(given: str, base: str) -> str:
    """The note when --baseline names another arm than the plan's baseline: the table and the looks differ in sign."""
    return (
        f"note: --baseline {given} is not the baseline of the looks ('{base}'): the table's differences are against "
        f"{given}, the sequential decisions against '{base}'; without --baseline both are against '{base}'"
    )
