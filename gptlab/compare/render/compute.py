"""Equal compute in words: one sentence per arm and axis, and the matched arms."""

from __future__ import annotations

from gptlab.compare.render import words
from gptlab.compare.statistics.verdict import Status
from gptlab.compare.tables.compute import AXES, ArmAt, AxisResult, EqualCompute


def _x_text(axis: str, x: float) -> str:
    return f"{x:.3g} FLOPs" if axis == "flops" else f"{x:.1f} s"


def _ci_text(a: ArmAt) -> str:
    return f" [95% CI {a.ci[0]:+.4f}, {a.ci[1]:+.4f}]" if a.ci else ""


def _how(ax: AxisResult) -> str:
    """Where the common x is: a point of the runs' grid, else the most every run reached (on a time axis read
    between evals)."""
    if ax.planned:
        return "a point of the runs' shared train.eval_flops grid, read between evals a step apart"
    return "the most every run reached; interpolated" if ax.axis != "flops" else "the most every run reached"


def _arm_line(where: str, a: ArmAt) -> str:
    """One arm's reading: its mean, Δ, interval and verdict; a chord a grid could have measured is no reading."""
    if a.verdict.status in (Status.INTERPOLATED, Status.NOT_MEASURED):  # not measured there, or not timed
        return f"{where}: '{a.label}' {words.change(a.verdict, 'val loss')}."
    return f"{where}: '{a.label}' {a.mean:.4f}, Δ {a.delta:+.4f}{_ci_text(a)}: {words.change(a.verdict, 'val loss')}."


def match_line(label: str, rec: dict) -> str:
    """One matched arm in words: what it held equal, the knob's value and the residual mismatch."""
    unit = "params" if rec.get("mode") == "params" else "FLOPs/token"
    hidden = f" (MLP hidden {rec['mlp_hidden']})" if rec.get("knob") == "mlp" and rec.get("mlp_hidden") else ""
    pct = rec.get("residual_pct")
    step = rec.get("step")
    to = rec.get("baseline", {}).get("match_to") or []
    return (
        f"'{label}': {rec.get('mode')} matched to the baseline (conf defaults{' + ' + ', '.join(to) if to else ''}) "
        f"by {rec.get('key')} {rec.get('configured')} -> {rec.get('resolved'):.6g}{hidden}; residual "
        f"{rec.get('residual', 0):+,.0f} {unit}"
        + (f" ({pct:+.3f}%)" if pct is not None else "")
        + (f", one rounding step {step:,.0f}" if step else "")
    )


def lines(ec: EqualCompute | None) -> list[str]:
    """The report's equal-compute sentences: one per arm and axis, then the matched arms."""
    if ec is None:
        return []
    out = []
    for ax in ec.axes:
        name = AXES[ax.axis]
        if ax.x is None:
            out.append(f"Val loss at equal {name}: {ax.missing}.")
            continue
        where = f"Val loss at equal {name} ({_x_text(ax.axis, ax.x)}, {_how(ax)})"
        out += [_arm_line(where, a) for a in ax.arms[1:]]
        if ax.interpolated:
            out.append(
                f"Equal {name} is not measured where a reading falls between evals: the runs share no "
                "train.eval_flops grid, and a straight line between two evals sits above a falling curve, which "
                f"favours the arm read nearer an eval. Measure it: {ax.remeasure} (the sweep relaunched into a new "
                "dir plans one grid for every arm)."
            )
    if ec.rebuilt:
        out.append(f"{len(ec.rebuilt)} run(s) predate the flops column: rebuilt as tokens × their flops_per_token.")
    out += [match_line(label, rec) for label, rec in ec.matched.items()]
    return out
