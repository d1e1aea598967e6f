"""Speed verdicts from a timing session read back (compare/reading/timing.py): each timed arm against a baseline,
paired within rounds and held against the session's own A/A (compare/statistics/rounds.py), with compare's load
caveat: an arm whose windows ran under outside load above the limit (or the session's baseline, whose windows make
the A/A) is UNDER_LOAD; an arm that builds the baseline's model with the same speed settings is IDENTICAL.

The baseline may be any timed arm, not only the session's (compare picks its baseline by its own rule). Against an
arm X, round r's ratio is x[r, arm] / x[r, X] and the A/A stays the session's (its baseline's two windows b1, b2):
`rebased` hands rounds.py X's window as two, x * sqrt(b1 / b2) and x * sqrt(b2 / b1), whose geometric mean is x and
whose ratio is the session's A/A b2 / b1, and the session's baseline as one window, sqrt(b1 * b2). The ratio then
carries two windows' noise rather than 1.5, which its interval, taken over the rounds' own ratios, measures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from gptlab.compare.reading.group import Group
from gptlab.compare.reading.timing import Matching, Session
from gptlab.compare.statistics.rounds import RoundSpeed, round_rates, second, session_speeds
from gptlab.compare.statistics.speed import OUTSIDE_LOAD_LIMIT
from gptlab.compare.statistics.stats import ALPHA


def rebased(rates: Sequence[Mapping[str, float]], baseline: str, new: str) -> list[dict[str, float]]:
    """Per-round rates (round_rates) re-labelled so that `new` is the baseline and the A/A stays `baseline`'s (see
    the module docstring); a round without `new` or either baseline window keeps no window of the three."""
    out = []
    for row in rates:
        moved = {k: v for k, v in row.items() if k not in (baseline, second(baseline), new)}
        if {baseline, second(baseline), new} <= set(row):
            b1, b2, x = row[baseline], row[second(baseline)], row[new]
            moved.update({new: x * math.sqrt(b1 / b2), second(new): x * math.sqrt(b2 / b1)})
            moved[baseline] = math.sqrt(b1 * b2)
        out.append(moved)
    return out


def speeds(
    session: Session, baseline: str | None = None, alpha: float = ALPHA, limit: float = OUTSIDE_LOAD_LIMIT
) -> dict[str, RoundSpeed]:
    """Every timed arm but `baseline` (default: the session's) against it, in the session's order; {} while the
    baseline has no window yet (a session stopped before it was built)."""
    base = baseline if baseline is not None else session.baseline
    if base not in session.arms or session.baseline not in session.arms:
        return {}
    rates = round_rates(session.windows)
    if base != session.baseline:
        rates = rebased(rates, session.baseline, base)
    arms = session.arms
    loaded = {n for n, a in arms.items() if a.outside_load is not None and a.outside_load > limit}
    if session.baseline in loaded:
        loaded.add(base)  # its windows are the A/A every floor comes from: every arm is caveated
    ref = arms[base]
    identical = {n for n, a in arms.items() if (a.fingerprint, a.settings) == (ref.fingerprint, ref.settings)}
    found = session_speeds(rates, base, alpha, identical - {base}, loaded)
    return {name: found[name] for name in arms if name in found}


def group_speeds(
    matching: Matching, base: Group, alpha: float = ALPHA, limit: float = OUTSIDE_LOAD_LIMIT
) -> list[tuple[Group, RoundSpeed | None]]:
    """Each timed group but `base`, with its verdict against the arm that times `base`; None where `base` is untimed
    or one arm times both (the same build: no speed-up to measure). Untimed groups are the Matching's `untimed`."""
    base_arm = matching.arm_of(base)
    found = speeds(matching.session, base_arm.name, alpha, limit) if base_arm is not None else {}
    return [(g, found.get(arm.name)) for g, arm in matching.timed if g is not base]
