"""3. The seeds' ablation table, measured through the user path: gptlab-sweep + gptlab-compare --claims.

benchmarks/ablation.yaml holds the arms. Each round runs every arm once (`--seeds <round>`) into one sweep
dir, so arms alternate in time and a drifting machine hits them alike; gptlab-compare then takes each arm's
median over rounds and writes comparison.json, which this section reads back.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from benchmarks.common import Bench, BenchError, CpuMeter, gptlab, median, read_json, run, wait_quiet

SWEEP = Path(__file__).with_name("ablation.yaml")

# arm -> (compare --claims key that picks exactly that arm's group, claimed speed-up text, the claim's midpoint)
CLAIMS = {
    "sdpa": ("attention=mha, attention.impl=sdpa", "1.2–1.3× (Flash)", 1.25),
    "gqa4": ("attention.n_kv_head=4", "1.25×", 1.25),
    "gqa2": ("attention=gqa, attention.n_kv_head=2, mlp.ratio=4", "1.40×", 1.40),
    "mqa": ("attention=mqa", "1.50×", 1.50),
    "mlp3": ("mlp.ratio=3, attention.impl=naive", "1.10–1.15×", 1.125),
    "fast": ("mlp.ratio=3, attention.impl=sdpa", "1.6–1.8× (combined)", 1.7),
}


def sizes(bench: Bench) -> dict:
    full = dict(
        rounds=3,
        wait=15,
        extra=[
            "train.max_steps=25",
            "train.batch_size=16",
            "train.eval_interval=25",
            "train.eval_sequences=32",
            "train.speed_warmup=5",
        ],
    )
    quick = dict(
        rounds=1,
        wait=0,
        extra=[
            "model.n_layer=1",
            "model.d_model=64",
            "model.block_size=64",
            "train.max_steps=6",
            "train.batch_size=4",
            "train.eval_interval=6",
            "train.eval_sequences=4",
            "train.speed_warmup=2",
        ],
    )
    return bench.pick(full, quick)


def write_claims(path: Path) -> Path:
    """The --claims file for gptlab-compare: key -> {speedup: midpoint of the seeds' claim}."""
    path.write_text(yaml.safe_dump({key: {"speedup": mid} for key, _, mid in CLAIMS.values()}, sort_keys=False))
    return path


def compare(bench: Bench, sweep_dir: Path, baseline_arm: str, claims: Path | None = None) -> dict:
    """Run gptlab-compare on a sweep dir (baseline = that arm's first run) and return comparison.json."""
    base = next(iter(sorted((sweep_dir / baseline_arm).glob("seed*"))), None)
    if base is None:
        raise BenchError(f"{sweep_dir / baseline_arm}: no runs to use as the baseline")
    out = sweep_dir / "comparison"
    args = [*gptlab("compare"), str(sweep_dir), "--baseline", str(base), "--out", str(out), "--no-wandb"]
    args.append("--time")  # speed-ups come from a timing session only: the sweep's arms timed alone first
    run(bench, args + (["--claims", str(claims)] if claims else []))
    return read_json(out / "comparison.json")


def arm_of(row: dict, sweep_dir: Path) -> str:
    """The arm a comparison row belongs to: the folder of its runs under the sweep dir."""
    return Path(row["runs"][0]).resolve().relative_to(sweep_dir.resolve()).parts[0]


def measure(bench: Bench) -> dict:
    s = sizes(bench)
    sweep_dir = bench.dir("ablation") / "sweep"
    foreign = []
    for r in range(s["rounds"]):
        bench.log(f"ablation round {r + 1}/{s['rounds']}: gptlab-sweep {SWEEP.name} --seeds {r}")
        wait_quiet(bench, s["wait"])
        with CpuMeter() as meter:
            run(bench, [*gptlab("sweep"), str(SWEEP), *s["extra"], "--seeds", str(r), "--out", str(sweep_dir)])
        foreign.append(meter.foreign)
    cmp = compare(bench, sweep_dir, "baseline", write_claims(bench.work / "ablation" / "claims.yaml"))
    arms = list(yaml.safe_load(SWEEP.read_text())["arms"])
    rows = []
    for row in cmp["rows"]:
        arm = arm_of(row, sweep_dir)
        claim = CLAIMS.get(arm)
        rows.append(
            {
                "arm": arm,
                "label": row["label"],
                "tokens_per_s": row["tokens_per_s"],
                "step_ms": row["step_ms"],
                "peak_mem_bytes": row["peak_mem_bytes"],
                "mfu": row["mfu"],
                "speedup": row["speedup"],
                "params": row["params"],
                "n_runs": row["n_seeds"],
                "claimed": claim[1] if claim else None,
                "claimed_speedup": (row.get("claimed") or {}).get("speedup"),
            }
        )
    rows.sort(key=lambda r: arms.index(r["arm"]))
    return {
        "setup": {
            "sweep": str(SWEEP.relative_to(SWEEP.parents[1])),
            "extra_overrides": s["extra"],
            "rounds": s["rounds"],
            "compared_at_step": cmp["step"],
        },
        "rows": rows,
        "foreign_cpu": median(foreign),
    }


def markdown(res: dict) -> str:
    s = res["setup"]
    lines = [
        f"`gptlab-sweep {s['sweep']} {' '.join(s['extra_overrides'])} --seeds <round>` for {s['rounds']} "
        f"interleaved round{'s' if s['rounds'] > 1 else ''}, then "
        "`gptlab-compare <sweep dir> --baseline <baseline run> --claims <claims>`; "
        "figures are gptlab-compare's (median over rounds of each run's median).",
        "",
        "| arm | what differs from the baseline | params | tokens/s | step ms | peak mem MiB | speed-up | "
        "claimed (seeds) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['arm']} | {r['label']} | {r['params'] / 1e6:.2f}M | {r['tokens_per_s']:,.0f} | "
            f"{r['step_ms']:.1f} | {r['peak_mem_bytes'] / 2**20:,.0f} | {r['speedup']:.2f}× | "
            f"{r['claimed'] or ''} |"
        )
    return "\n".join(lines)
