"""4. Equal-step quality: sweeps/fast.yaml and sweeps/attention.yaml at one fixed step budget, several seeds.

Both sweeps run as users run them (`gptlab-sweep NAME <budget overrides> --out DIR`), on the bundled corpus
with the sweep's shared data_seed; gptlab-compare gives Δ val loss vs the baseline arm with its Welch verdict.
"""

from __future__ import annotations

from benchmarks.ablation import arm_of, compare
from benchmarks.common import Bench, CpuMeter, gptlab, median, run

SWEEPS = {"fast": "baseline", "attention": "mha"}  # sweep -> its baseline arm


def sizes(bench: Bench) -> dict:
    full = dict(
        seeds="0,1,2",
        budget=[
            "train.max_steps=100",
            "train.eval_interval=50",
            "train.batch_size=16",
            "sample.tokens=0",
            "logger=none",
        ],
    )
    quick = dict(
        seeds="0,1",
        budget=[
            "model.n_layer=1",
            "model.d_model=64",
            "model.block_size=64",
            "train.max_steps=4",
            "train.eval_interval=2",
            "train.batch_size=4",
            "train.eval_sequences=8",
            "sample.tokens=0",
            "logger=none",
        ],
    )
    return bench.pick(full, quick)


def measure(bench: Bench) -> dict:
    s = sizes(bench)
    out = bench.dir("quality")
    sweeps, foreign = {}, []
    for name, baseline in SWEEPS.items():
        sweep_dir = out / name
        bench.log(f"quality: gptlab-sweep {name} (seeds {s['seeds']})")
        with CpuMeter() as meter:
            run(bench, [*gptlab("sweep"), name, *s["budget"], "--seeds", s["seeds"], "--out", str(sweep_dir)])
        foreign.append(meter.foreign)
        cmp = compare(bench, sweep_dir, baseline)
        rows = [
            {
                "arm": arm_of(r, sweep_dir),
                "label": r["label"],
                "n_seeds": r["n_seeds"],
                "val_loss_mean": r["val_loss_mean"],
                "val_loss_std": r["val_loss_std"],
                "delta_val_loss": r["delta_val_loss"],
                "p_value": r["p_value"],
                "significant": r["significant"],
            }
            for r in cmp["rows"]
        ]
        sweeps[name] = {"step": cmp["step"], "baseline": baseline, "rows": rows}
    return {
        "setup": {"seeds": s["seeds"], "budget_overrides": s["budget"]},
        "sweeps": sweeps,
        "foreign_cpu": median(foreign),
    }


def markdown(res: dict) -> str:
    s = res["setup"]
    lines = [
        f"`gptlab-sweep fast|attention {' '.join(s['budget_overrides'])} --seeds {s['seeds']}`, then "
        "`gptlab-compare`; Δ = arm − baseline mean val loss at the common step; "
        "verdict: Welch t-test, α = 0.05.",
        "",
        "| sweep | arm | vs baseline | step | val loss (mean ± std) | Δ val loss | p | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, sw in res["sweeps"].items():
        for r in sw["rows"]:
            std = f" ± {r['val_loss_std']:.4f}" if r["val_loss_std"] is not None else ""
            verdict = (
                "baseline"
                if r["arm"] == sw["baseline"]
                else "n/a (1 seed)"
                if r["significant"] is None
                else "significant"
                if r["significant"]
                else "within seed noise"
            )
            p = "" if r["p_value"] is None or r["arm"] == sw["baseline"] else f"{r['p_value']:.3f}"
            lines.append(
                f"| {name} | {r['arm']} | {r['label']} | {sw['step']} | {r['val_loss_mean']:.4f}{std} | "
                f"{r['delta_val_loss']:+.4f} | {p} | {verdict} |"
            )
    return "\n".join(lines)
