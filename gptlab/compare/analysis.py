"""Line runs up at one common step and compute the per-group comparison rows (the comparison.json contract)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from gptlab.compare import speed, stats
from gptlab.compare.claims import attach_claims
from gptlab.compare.group import Group, assign_labels, check_same_task, diff_items, find_baseline, group_runs
from gptlab.compare.identical import identical_groups, mixed_fingerprints, shared
from gptlab.compare.runs import Run
from gptlab.compare.stats import ALPHA
from gptlab.errors import ConfigError


@dataclass
class Row:
    """One group's line of the table; keys up to `flops_per_token` are the comparison.json contract."""

    label: str
    choices: dict[str, str]
    n_seeds: int
    val_loss_mean: float
    val_loss_std: float | None
    delta_val_loss: float
    significant: bool | None
    tokens_per_s: float | None
    step_ms: float | None
    mfu: float | None
    peak_mem_bytes: int | None
    speedup: float | None
    params: int | None
    flops_per_token: float | None
    p_value: float | None = None
    val_acc_mean: float | None = None
    differs: dict[str, str] = field(default_factory=dict)
    seeds: list[Any] = field(default_factory=list)
    val_losses: list[float] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    claimed: dict[str, float] | None = None
    # Speed with its noise: mean ± std over seeds of each run's median, the speed-up's CI and verdict.
    tokens_per_s_std: float | None = None
    step_ms_std: float | None = None
    tokens_per_s_seeds: list[float] = field(default_factory=list)
    speedup_ci: list[float] | None = None
    speedup_p: float | None = None
    speed_verdict: str = "–"
    outside_load: float | None = None
    under_load: bool = False
    model_fingerprint: str | None = None
    identical_to: list[str] = field(default_factory=list)


@dataclass
class Comparison:
    """Everything the reports need: the step, the baseline label, rows (baseline first) and warnings."""

    step: int
    baseline: str
    rows: list[Row]
    groups: list[Group]
    warnings: list[str]
    targets: list[Any] = field(default_factory=list)  # target.TargetResult per --target / --threshold
    thresholds: list[Any] = field(default_factory=list)  # threshold.Threshold per --threshold
    decode: list[Any] = field(default_factory=list)  # decode.DecodeRow per group and point, when runs have decode.json

    def to_json(self) -> dict[str, Any]:
        """The comparison.json document (`targets`/`thresholds` only when asked for)."""
        doc = {
            "step": self.step,
            "baseline": self.baseline,
            "alpha": ALPHA,
            "rows": [asdict(r) for r in self.rows],
            "warnings": self.warnings,
        }
        doc.update(
            {k: [x.to_json() for x in v] for k, v in (("targets", self.targets), ("thresholds", self.thresholds)) if v}
        )
        if self.decode:
            from gptlab.compare.decode import to_json

            doc["decode"] = to_json(self.decode)
        return doc


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


def _span(run: Run) -> str:
    steps = run.val_steps()
    return f"{steps[0]}..{steps[-1]}" if steps else "none"


def stop_warnings(runs: list[Run], step: int) -> list[str]:
    """One line per run that crashed, is unfinished or stopped before the others."""
    reach = max(r.val_steps()[-1] for r in runs)
    out = []
    for run in runs:
        last = run.val_steps()[-1]
        if run.status != "finished":
            out.append(
                f"warning: {run.path}: status {run.status}, last val/loss at step {last} "
                f"(others reach {reach}); compared at step {step}"
            )
        elif last < reach:
            out.append(
                f"warning: {run.path}: stopped early, last val/loss at step {last} (others reach {reach}); "
                f"compared at step {step}"
            )
    return out


def _first(runs: list[Run], key: str) -> Any:
    return next((r.summary[key] for r in runs if r.summary.get(key) is not None), None)


def _row(g: Group, step: int) -> Row:
    runs = g.runs
    losses = [float(r.by_step[step]["val/loss"]) for r in runs]
    accs = [float(r.by_step[step]["val/acc"]) for r in runs if r.by_step[step].get("val/acc") is not None]
    peaks = [speed.run_speed(r, "peak_mem_bytes", "peak_mem_bytes", max) for r in runs]
    tps = speed.per_run(runs, "tokens_per_s_median", "tokens_per_s")
    (tps_mean, tps_std), (ms_mean, ms_std) = (
        speed.spread(tps),
        speed.spread(speed.per_run(runs, "step_ms_median", "step_ms")),
    )
    load = speed.outside_load(runs)
    return Row(
        label=g.label,
        choices=dict(runs[0].choices),
        n_seeds=len(runs),
        val_loss_mean=stats.mean(losses),
        val_loss_std=stats.std(losses),
        delta_val_loss=0.0,
        significant=None,
        tokens_per_s=tps_mean,
        step_ms=ms_mean,
        mfu=stats.median(cast(list[float], [speed.run_speed(r, "mfu_median", "mfu", stats.median) for r in runs])),
        peak_mem_bytes=max((int(p) for p in peaks if p is not None), default=None),
        speedup=None,
        params=_first(runs, "params"),
        flops_per_token=_first(runs, "flops_per_token"),
        val_acc_mean=stats.mean(accs) if accs else None,
        seeds=[r.config.get("seed") for r in runs],
        val_losses=losses,
        runs=[str(r.path) for r in runs],
        tokens_per_s_std=tps_std,
        step_ms_std=ms_std,
        tokens_per_s_seeds=tps,
        outside_load=load,
        under_load=load is not None and load > speed.OUTSIDE_LOAD_LIMIT,
        model_fingerprint=shared(g, "model_fingerprint"),
    )


def _speed_versus(row: Row, base: Row) -> None:
    """Speed-up of row over the baseline with its CI and verdict; identical models are noise by definition."""
    if row is base:
        row.speedup = 1.0 if row.tokens_per_s else None
        row.speed_verdict = "baseline"
        return
    up = speed.speedup(row.tokens_per_s_seeds, base.tokens_per_s_seeds, ALPHA)
    row.speedup, row.speedup_p = up.ratio, up.p
    row.speedup_ci = list(up.ci) if up.ci else None
    row.speed_verdict = speed.IDENTICAL if base.label in row.identical_to and up.ratio else up.verdict
    if up.ratio is not None and (row.under_load or base.under_load):
        row.speed_verdict += ", under outside load"


def _versus(row: Row, base: Row) -> None:
    """Fill delta, Welch verdict and speed-up of row against the baseline row."""
    row.delta_val_loss = row.val_loss_mean - base.val_loss_mean
    _speed_versus(row, base)
    if row is base:
        row.significant, row.p_value = False, 1.0
        return
    test = stats.welch_test(row.val_losses, base.val_losses)
    if test is not None:
        row.p_value = test.p
        row.significant = bool(test.p < ALPHA)
    if base.label in row.identical_to:
        row.significant = False  # the same experiment twice: any gap is seed or load noise


def identity_warnings(rows: list[Row], groups: list[Group]) -> list[str]:
    """One line per identical pair, per group with mixed fingerprints, and per group timed under outside load."""
    out = [
        f"warning: '{a.label}' and '{b.label}' build the identical model (fingerprint {a.model_fingerprint}) "
        "and differ only in model config: every difference between them is noise"
        for i, a in enumerate(rows)
        for b in rows[i + 1 :]
        if b.label in a.identical_to
    ]
    out += [
        f"warning: '{g.label}': its runs recorded different model fingerprints (code changed between seeds?)"
        for g in groups
        if mixed_fingerprints(g)
    ]
    out += [
        f"warning: '{row.label}': speed taken under outside load (other processes used up to "
        f"{100 * cast(float, row.outside_load):.0f}% of the cores in one of its runs; limit {100 * speed.OUTSIDE_LOAD_LIMIT:.0f}%)"
        for row in rows
        if row.under_load
    ]
    return out


def compare(
    runs: list[Run],
    baseline: str | None = None,
    step: int | None = None,
    claims: dict[str, dict[str, float]] | None = None,
) -> Comparison:
    """Group runs, choose the baseline and step, and compute one row per group (baseline first)."""
    check_same_task(runs)
    at = common_step(runs, step)
    groups = group_runs(runs)
    base = find_baseline(groups, baseline)
    assign_labels(groups, base)
    ordered = [base] + [g for g in groups if g is not base]
    rows = [_row(g, at) for g in ordered]
    twins = identical_groups(ordered)
    for g, row in zip(ordered, rows):
        row.differs = dict(diff_items(g, base)) if g is not base else {}
        row.identical_to = [h.label for h in twins.get(id(g), [])]
    for row in rows:
        _versus(row, rows[0])
    if claims:
        attach_claims(rows, ordered, claims)
    return Comparison(at, base.label, rows, ordered, stop_warnings(runs, at) + identity_warnings(rows, ordered))


def add_targets(cmp: Comparison, runs: list[Run], targets: list, thresholds: list, key: str | None) -> None:
    """Steps-to-target rows for each --target and --threshold target (once each), then each threshold's answer."""
    from gptlab.compare.target import check_metric, steps_to_target
    from gptlab.compare.threshold import threshold

    for flag, wanted in (("--target", targets), ("--threshold", thresholds)):
        for t in wanted:
            check_metric(t, runs, flag)
    results: dict = {}
    for t in [*targets, *thresholds]:
        results.setdefault(t, steps_to_target(cmp.groups, t))
    cmp.targets = list(results.values())
    cmp.thresholds = [threshold(cmp.groups, results[t], key) for t in thresholds]
