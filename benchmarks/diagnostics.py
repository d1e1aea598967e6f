"""What train.diagnostics costs (issue 20): the same run with diagnostics off, on every 10th step and on every step,
side by side in rounds (off, every 10, every 1, then again), so drift in the machine's load hits every arm alike.

    python -m benchmarks.diagnostics [--rounds 3] [--steps 60] [--out docs/] [model overrides ...]

Per run: the loop's wall time from summary.json (`wall_s`: steps + evals + checkpoints), the training step's median
(`step_ms_median`, which excludes the diagnostics' own time) and the diagnostics' time per logged step (`diag_ms` rows).
Reported: wall-time overhead vs off as a ratio per round (median and min-max), diag_ms per diagnostic step, and the
same run's train/loss at the last step (diagnostics never change the curve: the three must be equal).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from benchmarks.common import Bench, CpuMeter, gptlab, hermetic_env, machine, median, read_json, read_rows, run
from gptlab.util.io import strict_json

ARMS = {
    "off": [],
    "every 10 steps": ["train.diagnostics=true", "train.log_interval=10"],
    "every step": ["train.diagnostics=true", "train.log_interval=1"],
}
BASE = [
    "model=tiny",
    "hardware.dtype=fp32",
    "hardware.threads=1",
    "hardware.peak_flops=1e12",
    "logger=none",
    "sample.tokens=0",
    "train.batch_size=8",
    "train.speed_warmup=5",
    "train.ckpt_interval=0",
]


def one(bench: Bench, arm: str, steps: int, extra: list[str], tag: str) -> dict:
    run_dir = bench.work / tag
    with CpuMeter() as meter:
        run(
            bench,
            [
                *gptlab("train"),
                *BASE,
                f"train.max_steps={steps}",
                f"train.eval_interval={steps}",
                *extra,
                *ARMS[arm],
                f"hydra.run.dir={run_dir}",
            ],
        )
    summary, rows = read_json(run_dir / "summary.json"), read_rows(run_dir / "metrics.jsonl")
    diag = [r["diag_ms"] for r in rows if "diag_ms" in r]
    return {
        "arm": arm,
        "wall_s": summary["wall_s"],
        "step_ms_median": summary["step_ms_median"],
        "diag_ms_median": median(diag),
        "diag_steps": len(diag),
        "outside_load": meter.foreign,
        "final_train_loss": next(r["train/loss"] for r in reversed(rows) if "train/loss" in r),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", type=Path, default=None, help="write diagnostics_overhead.json here")
    ap.add_argument("overrides", nargs="*", help="more gptlab-train overrides for every run (e.g. model.n_layer=8)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gptlab-diag-") as tmp:
        bench = Bench(quick=False, work=Path(tmp))
        bench.env = hermetic_env(bench.work)
        runs = []
        for r in range(args.rounds):
            for i, arm in enumerate(ARMS):
                bench.log(f"round {r + 1}/{args.rounds}: {arm}")
                runs.append(one(bench, arm, args.steps, args.overrides, f"r{r}-{i}"))
    off = {i // len(ARMS): x["wall_s"] for i, x in enumerate(runs) if x["arm"] == "off"}
    result = {"machine": machine(), "steps": args.steps, "base": BASE + args.overrides, "runs": runs, "arms": {}}
    for arm in ARMS:
        mine = [(i // len(ARMS), x) for i, x in enumerate(runs) if x["arm"] == arm]
        ratios = [x["wall_s"] / off[r] for r, x in mine]
        result["arms"][arm] = {
            "wall_ratio_median": median(ratios),
            "wall_ratio_min": min(ratios),
            "wall_ratio_max": max(ratios),
            "step_ms_median": median([x["step_ms_median"] for _, x in mine]),
            "diag_ms_median": median([x["diag_ms_median"] for _, x in mine]),
            "diag_steps": mine[0][1]["diag_steps"],
            "outside_load_max": max(x["outside_load"] or 0 for _, x in mine),
            "final_train_loss": sorted({x["final_train_loss"] for _, x in mine}),
        }
    text = json.dumps(strict_json(result), indent=2)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "diagnostics_overhead.json").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
