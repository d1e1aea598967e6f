"""Accuracy vs steps of an associative-recall sweep: one mean line + min-max band over seeds per arm.

    python -m benchmarks.assoc_recall_plot /tmp/ar --out docs/assoc_recall.png

Reads <sweep dir>/<arm>/seed<k>/metrics.jsonl (gptlab-sweep's layout) and prints, per arm and seed, the
final val/acc and the first eval step at which val/acc >= --target (the table in docs/ASSOC_RECALL.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def read_curves(sweep_dir: Path, metric: str = "val/acc") -> dict[str, dict[int, list[tuple[int, float]]]]:
    """{arm: {seed: [(step, value), ...]}} from every <arm>/seed<k>/metrics.jsonl under sweep_dir."""
    curves: dict[str, dict[int, list[tuple[int, float]]]] = {}
    for path in sorted(sweep_dir.glob("*/seed*/metrics.jsonl")):
        arm, seed = path.parent.parent.name, int(path.parent.name.removeprefix("seed"))
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        points = sorted({r["step"]: r[metric] for r in rows if metric in r}.items())
        if points:
            curves.setdefault(arm, {})[seed] = points
    if not curves:
        raise SystemExit(f"no {metric} in {sweep_dir}/*/seed*/metrics.jsonl")
    return curves


def first_reach(points: list[tuple[int, float]], target: float) -> int | None:
    """The first eval step with value >= target, or None."""
    return next((step for step, value in points if value >= target), None)


def _arm_order(arm: str) -> tuple:
    digits = "".join(c for c in arm if c.isdigit())
    return (int(digits) if digits else 0, arm)


def table(curves: dict, target: float) -> str:
    """Markdown: per arm, final val/acc per seed, mean ± std, first step reaching the target per seed."""
    lines = [
        f"| arm | final val/acc per seed | mean ± std | first step >= {target:.0%} per seed |",
        "|---|---|---|---|",
    ]
    for arm in sorted(curves, key=_arm_order):
        seeds = curves[arm]
        finals = [seeds[s][-1][1] for s in sorted(seeds)]
        reach = [first_reach(seeds[s], target) for s in sorted(seeds)]
        std = statistics.stdev(finals) if len(finals) > 1 else 0.0
        per_seed = " / ".join(f"{v:.3f}" for v in finals)
        steps = " / ".join("not reached" if r is None else str(r) for r in reach)
        lines.append(f"| {arm} | {per_seed} | {statistics.mean(finals):.3f} ± {std:.3f} | {steps} |")
    return "\n".join(lines)


def plot(curves: dict, out: Path, target: float, title: str) -> None:
    """One PNG: mean val/acc over seeds per arm with its min-max band, the target as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for arm in sorted(curves, key=_arm_order):
        runs = list(curves[arm].values())
        steps = sorted(set.intersection(*(set(s for s, _ in r) for r in runs)))  # steps every seed evaluated
        values = [[dict(r)[s] for r in runs] for s in steps]  # (steps, seeds)
        mean = [statistics.mean(v) for v in values]
        (line,) = ax.plot(steps, mean, label=f"{arm} ({len(runs)} seeds)")
        ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], color=line.get_color(), alpha=0.2)
    ax.axhline(target, color="grey", linestyle="--", linewidth=1)
    ax.set(xlabel="step", ylabel="val/acc (query positions)", ylim=(0, 1.02), title=title)
    ax.grid(alpha=0.3)
    ax.legend(loc="center right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--out", type=Path, default=Path("docs/assoc_recall.png"))
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--title", default="Associative recall: val/acc vs steps (mean, min-max over seeds)")
    args = parser.parse_args(argv)
    curves = read_curves(args.sweep_dir)
    plot(curves, args.out, args.target, args.title)
    print(table(curves, args.target))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
