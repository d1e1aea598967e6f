"""Factorial effects: a 2^k sweep (`gptlab-sweep NAME --factorial`, arms `base`, `a`, `a+b`, ...) as main effects and
interactions on final val loss and on speed, fitted by statsmodels.

Each factor is coded -1/2 (off) and +1/2 (on), so a main effect's coefficient is the mean change when the factor is
turned on, averaged over the other factors' levels, and a two-way interaction's is how much one factor's effect
changes when the other is on (the difference of differences). The full model `y ~ f1 * f2 * ... * fk` is fitted by
OLS over every seed's run (the seeds are the only residual); intervals and p-values are the OLS t-tests, and the ANOVA
table is statsmodels' anova_lm (type II).

Speed is the timing session's (gptlab/train/timing.py: each arm timed alone, in interleaved rounds), never a training
run's own tokens/s, which holds whatever shared its machine: log tokens/s of each arm's window per round (the
baseline's two windows as their geometric mean, as the paired speed-ups take them), fitted as `y ~ C(round) +
f1 * ... * fk` with the rounds as blocks, so what a round's windows share (load, clock drift) cancels as it does in
the pairing. Its effects are ratios (exp of the coefficient). Without a session that times every arm the speed
effects are "not timed", with the command that times them.

The additivity line asks of the arm with every factor on: is its effect vs `base` the sum (loss) or the product
(speed) of the single-factor arms' effects? It is the cell-means contrast all - sum(singles) + (k - 1)·base, tested
by OLS t_test; "additive" when its interval contains 0. An arm whose timed windows ran under outside load is
flagged, as in every speed column of gptlab-compare.

Each run counts once, as in the main comparison: a copied run dir (reading/identity.dedupe) and a rerun of an arm's
config with the same seeds (reading/group.one_run_per_seed) are left out, with the same warning lines. So is a run
that did not finish (preempted, diverged, failed: its last val loss is from another step), with a line of its own.
Every one of the 2^k arms must have a finished run's final val loss; the speed effects are fitted only when the
session times every arm (an arm it does not time leaves its cell empty, and the contrasts are then not estimable:
`speed_missing` names it).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

from gptlab.compare.reading.group import group_runs, one_run_per_seed
from gptlab.compare.reading.identity import dedupe
from gptlab.compare.reading.runs import Run
from gptlab.compare.reading.timing import Matching
from gptlab.compare.statistics.rounds import round_rates, second
from gptlab.compare.statistics.speed import OUTSIDE_LOAD_LIMIT
from gptlab.compare.statistics.stats import ALPHA
from gptlab.errors import ConfigError
from gptlab.sweep.layout import BASE_ARM, FACTOR_SEP, cell_factors, read_sweep
from gptlab.util.note import Note, warning


def sweep_factors(sweep_dir: Path) -> list[str]:
    """The factor names a factorial sweep dir's sweep.yaml records ([] when it is not a factorial sweep)."""
    recorded = read_sweep(sweep_dir, strict=False)
    return recorded.factors if recorded else []


def arm_levels(arm: str, factors: list[str]) -> dict[str, int]:
    """{factor: 0/1} of an arm named `base` or by its factors joined with '+'."""
    on = set(cell_factors(arm))
    if on - set(factors):
        raise ConfigError(
            f"arm '{arm}': {sorted(on - set(factors))[0]} is not a factor of this sweep ({', '.join(factors)})"
        )
    return {f: int(f in on) for f in factors}


def _arm(run: Run) -> str:
    arm = run.config.get("arm")
    if not isinstance(arm, str):
        raise ConfigError(f"{run.path}: no `arm` in its config; a factorial needs gptlab-sweep's arm names")
    return arm


def once(runs: list[Run]) -> tuple[list[Run], list[Note]]:
    """(each run once, in the order given; the main comparison's warning line per copy or replay left out).

    Replays are looked for within an arm: two arms whose configs happen to agree are still two cells."""
    runs, copies = dedupe(runs)
    arms: dict[str, list[Run]] = {}
    for run in runs:
        arms.setdefault(_arm(run), []).append(run)
    groups = [g for same in arms.values() for g in group_runs(same)]
    replays = one_run_per_seed(groups)
    kept = {id(r) for g in groups for r in g.runs}
    return [r for r in runs if id(r) in kept], copies + replays


def unfinished(runs: list[Run]) -> list[Note]:
    """A warning per run that did not finish: its final val loss is from another step (or a diverging curve), so the
    factorial leaves it out."""
    return [
        warning(
            f"{run.path}: status {run.status}: left out of the factorial effects (its last val loss is not a finished "
            "run's)",
            subject=str(run.path),
        )
        for run in runs
        if run.status != "finished"
    ]


@dataclass(frozen=True)
class TimedRate:
    """One factorial arm's tokens/s in one round of a timing session, and whether its windows ran under load."""

    arm: str
    round: int
    tokens_per_s: float
    loaded: bool


def timed_rates(matching: Matching | None, load_limit: float = OUTSIDE_LOAD_LIMIT) -> list[TimedRate] | None:
    """Each factorial arm's rate per round of the session that times the comparison (the baseline's: the geometric
    mean of its two windows), only rounds that hold every timed arm; None without a session. An arm is loaded when
    its windows, or the session baseline's (the A/A every pairing leans on), ran above `load_limit` outside load."""
    if matching is None:
        return None
    session = matching.session
    names = {_arm(g.runs[0]): arm.name for g, arm in matching.timed}  # factorial arm -> timed arm
    loaded = {n for n, a in session.arms.items() if a.outside_load is not None and a.outside_load > load_limit}
    out = []
    for r, row in enumerate(round_rates(session.windows)):
        base = session.baseline
        if base in row and second(base) in row:
            row = {**row, base: math.sqrt(row[base] * row[second(base)])}
        if all(name in row for name in names.values()):
            out += [TimedRate(a, r, row[n], n in loaded or base in loaded) for a, n in names.items()]
    return out


def _table(runs: list[Run], factors: list[str]):
    """One row per run: the factor codes (±1/2), arm and loss (NaN when it has no final val loss or did not finish)."""
    import pandas as pd

    rows = []
    for run in runs:
        levels = arm_levels(_arm(run), factors)
        arm = FACTOR_SEP.join(f for f in factors if levels[f]) or BASE_ARM  # in factor order, as _all_arms names it
        # a preempted or diverged run's last val loss is at another step than the others' final one
        loss = run.summary.get("final_val_loss") if run.status == "finished" else None
        codes = {f"f{i}": levels[f] - 0.5 for i, f in enumerate(factors)}
        rows.append({**codes, "arm": arm, "loss": math.nan if loss is None else float(loss)})
    return pd.DataFrame(rows)


def _speed_table(rates: list[TimedRate], factors: list[str]):
    """One row per (arm, round) timed: the factor codes, arm, round, log tokens/s and whether it ran under load."""
    import pandas as pd

    rows = []
    for rate in rates:
        levels = arm_levels(rate.arm, factors)
        arm = FACTOR_SEP.join(f for f in factors if levels[f]) or BASE_ARM
        codes = {f"f{i}": levels[f] - 0.5 for i, f in enumerate(factors)}
        rows.append({**codes, "arm": arm, "round": rate.round, "log_speed": math.log(rate.tokens_per_s),
                     "loaded": rate.loaded})  # fmt: skip
    return pd.DataFrame(rows, columns=[*(f"f{i}" for i in range(len(factors))), "arm", "round", "log_speed", "loaded"])


def _all_arms(factors: list[str]) -> list[str]:
    """The 2^k arm names in design order: base, the singles, the pairs, ..., all factors on."""
    on = [combo for n in range(len(factors) + 1) for combo in itertools.combinations(factors, n)]
    return [FACTOR_SEP.join(combo) or BASE_ARM for combo in on]


def _missing(df, column: str, factors: list[str]) -> list[str]:
    """The arms (design order) with no run that has a `column` value: a cell the full model cannot estimate."""
    present = set(df.loc[df[column].notna(), "arm"])
    return [arm for arm in _all_arms(factors) if arm not in present]


def _check_design(df, factors: list[str]) -> None:
    """Every one of the 2^k arms with a final val loss, and at least one residual degree of freedom (some arm with 2+
    seeds)."""
    wanted = 2 ** len(factors)
    missing = len(_missing(df, "loss", factors))
    if missing:
        raise ConfigError(
            f"factorial: {missing} of the {wanted} arms of {' x '.join(factors)} have no finished run; "
            "effects need every combination"
        )
    if df["loss"].notna().sum() <= wanted:
        raise ConfigError("factorial: one run per arm leaves no seed noise to test effects against; run 2+ seeds")


def _term(name: str, factors: list[str]) -> str:
    """statsmodels' `f0:f2` -> `gqa×mlp3`."""
    return "×".join(factors[int(part[1:])] for part in name.split(":"))


BLOCK = "C(round)"  # the speed model's block term: the timing session's rounds


def _fit(df, column: str, factors: list[str], alpha: float, blocks: bool = False) -> dict:
    """Effects (coefficient, interval, p) and the ANOVA table of the full factorial model of one response (with the
    rounds as blocks: `+ C(round)`, left out of the effects and named `round (block)` in the ANOVA)."""
    import statsmodels.formula.api as smf
    from statsmodels.stats.anova import anova_lm

    data = df[df[column].notna()]
    formula = f"{column} ~ " + " * ".join(f"f{i}" for i in range(len(factors))) + (f" + {BLOCK}" if blocks else "")
    model = smf.ols(formula, data=data).fit()
    ci = model.conf_int(alpha)
    effects = [
        {
            "term": _term(name, factors),
            "order": name.count(":") + 1,
            "effect": float(model.params[name]),
            "lo": float(ci.loc[name, 0]),
            "hi": float(ci.loc[name, 1]),
            "p": float(model.pvalues[name]),
        }
        for name in model.params.index
        if name != "Intercept" and not name.startswith(BLOCK)
    ]
    effects.sort(key=lambda e: e["order"])  # main effects, then two-way interactions, ... (stable within an order)
    table = anova_lm(model, typ=2)
    anova = [
        {"term": {"Residual": "residual", BLOCK: "round (block)"}.get(name) or _term(name, factors), "df": float(row["df"]),
         "sum_sq": float(row["sum_sq"]), "F": _num(row["F"]), "p": _num(row["PR(>F)"])}
        for name, row in table.iterrows()
    ]  # fmt: skip
    return {
        "effects": effects,
        "anova": anova,
        "df_resid": int(model.df_resid),
        "additivity": _additivity(data, column, factors, alpha, blocks),
    }


def _num(value) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _additivity(df, column: str, factors: list[str], alpha: float, blocks: bool = False) -> dict:
    """The combined arm's effect, the sum of the single-factor effects, and their difference with its interval (the
    block terms take weight 0: contrasts between arms)."""
    import statsmodels.formula.api as smf

    model = smf.ols(f"{column} ~ C(arm) - 1" + (f" + {BLOCK}" if blocks else ""), data=df).fit()
    cells = [n.removeprefix("C(arm)[").removesuffix("]") for n in model.params.index]
    everything = "+".join(factors)

    def weights(arms: dict[str, float]) -> list[list[float]]:
        absent = [arm for arm in arms if arm not in cells]
        if absent:  # the callers fit only designs with every cell: a silent weight 0 would test another contrast
            raise ValueError(f"factorial contrast: arm {absent[0]} is not a cell of the {column} model ({cells})")
        return [[arms.get(cell, 0.0) for cell in cells]]

    def test(arms: dict[str, float]) -> list[float]:
        result = model.t_test(weights(arms))
        lo, hi = (float(v) for v in result.conf_int(alpha)[0])
        return [float(result.effect[0]), lo, hi, float(result.pvalue)]

    k = len(factors)
    combined = test({everything: 1.0, BASE_ARM: -1.0})
    parts = test({**{f: 1.0 for f in factors}, BASE_ARM: -float(k)})
    difference = test({everything: 1.0, **{f: -1.0 for f in factors}, BASE_ARM: float(k - 1)})
    return {
        "combined": combined,
        "sum_of_parts": parts,
        "difference": difference,
        "additive": difference[1] <= 0 <= difference[2],
    }


def analyse(
    runs: list[Run],
    factors: list[str],
    alpha: float = ALPHA,
    speed: list[TimedRate] | None = None,
    not_timed: str = "",
    load_limit: float = OUTSIDE_LOAD_LIMIT,
) -> dict:
    """The factorial report of finished runs: loss effects and ANOVA; speed effects from `speed` (timed_rates: the
    timing session's rounds) when it times every arm, else `speed_missing` (the arms it does not time) or, with no
    session, `speed_not_timed` (`not_timed`: the command that times the arms); the arms timed under load (above
    `load_limit`, the comparison's: timed_rates flags them); `warnings`
    (a Note per copy or replay counted once and per run left out). JSON-ready but its warnings:
    compare/render/json_report.plain writes them."""
    if not factors:
        raise ConfigError("factorial: no factors (the sweep's sweep.yaml has no `factors:`)")
    runs, warnings = once(runs)
    warnings += unfinished(runs)
    df = _table(runs, factors)
    _check_design(df, factors)
    df = df[df["loss"].notna()]
    doc: dict = {"factors": factors, "alpha": alpha, "runs": len(df), "loss": _fit(df, "loss", factors, alpha)}
    doc["speed_not_timed"] = not_timed if speed is None else ""
    timed = _speed_table(speed or [], factors)
    doc["speed_missing"] = _missing(timed, "log_speed", factors) if speed is not None else []
    if speed is not None and not doc["speed_missing"] and timed["round"].nunique() >= 2:
        doc["speed"] = _fit(timed, "log_speed", factors, alpha, blocks=True)
        doc["speed_rounds"] = int(timed["round"].nunique())
    doc["speed_under_load"] = sorted(set(timed.loc[timed["loaded"].astype(bool), "arm"]))
    doc["load_limit"] = load_limit
    doc["warnings"] = warnings
    return doc
