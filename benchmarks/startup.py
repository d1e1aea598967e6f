"""5. Startup: command -> first optimizer step of `gptlab-train` (model=tiny), import costs, local sweep overhead.

The first step is timed from launching the command to its first `train/loss` row appearing in metrics.jsonl
(flushed per row). "cold" uses an empty gptlab cache (tokenize the corpus, measure the matmul peak);
"warm" re-runs with that cache, as every later run does. A local submitit sweep's per-run overhead is its
wall time minus the sum of its runs' own training time (summary.json wall_s), per run: the local queue as it
starts runs by default (forked from a warm interpreter), with --fresh-interpreters, and Hydra's basic launcher.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import Bench, BenchError, CpuMeter, gptlab, median, quiet, read_json, run, wait_quiet

MODULES = ("torch", "hydra", "omegaconf", "gptlab.cli.train", "datasets", "wandb")
CASES = {"default (W&B offline)": [], "logger=none": ["logger=none"]}  # warm-cache cases, interleaved
LAUNCHERS = {  # how a sweep's runs start, as the table names them
    "local": "local queue (runs forked from a warm interpreter)",
    "local-fresh": "local queue with `--fresh-interpreters`",
    "basic": "Hydra basic launcher (every run in one process)",
}


def sizes(bench: Bench) -> dict:
    full = dict(
        repeats=3,
        wait=15,
        model=[],
        sweep="mlp_ratio",
        seeds="0",
        sweep_extra=["train.max_steps=10", "train.eval_interval=10", "sample.tokens=0", "logger=none"],
        launchers=("local", "local-fresh", "basic"),
    )
    quick = dict(
        repeats=1,
        wait=0,
        model=["model.n_layer=1"],  # a cold compile of model=tiny's 1 block: 27 s against 40 s for its 4 (2 cores)
        sweep="mlp_ratio",
        seeds="0",
        sweep_extra=[
            "model.n_layer=1",
            "train.max_steps=2",
            "train.eval_interval=2",
            "train.batch_size=4",
            "train.eval_sequences=4",
            "sample.tokens=0",
            "logger=none",
        ],
        launchers=("local",),
    )
    return bench.pick(full, quick)


def import_times(bench: Bench) -> dict:
    """Cumulative import seconds per module (python -X importtime), imported in MODULES order in one process."""
    code = "; ".join(f"import {m}" for m in MODULES)
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], env=bench.env, capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        raise BenchError(f"python -X importtime -c '{code}' failed: {proc.stderr.strip().splitlines()[-1:]}")
    found = {}
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", line)
        if m and m.group(3) in MODULES and m.group(3) not in found:
            found[m.group(3)] = int(m.group(1)) / 1e6
    return found


def first_step(bench: Bench, out: Path, extra: list[str], **env: str) -> dict:
    """Seconds from launching gptlab-train to its first optimizer step's row, and to the process's exit."""
    run_dir = out / f"run{time.monotonic_ns()}"
    env = dict(bench.env, **env)
    args = [
        *gptlab("train"),
        "model=tiny",
        *sizes(bench)["model"],
        "train.max_steps=3",
        "train.log_interval=1",
        "sample.tokens=0",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]
    metrics = run_dir / "metrics.jsonl"
    err = out / f"{run_dir.name}.stderr"
    t0 = time.perf_counter()
    with open(err, "w") as err_file, CpuMeter() as meter:
        proc = subprocess.Popen(args, cwd=out, env=env, stdout=subprocess.DEVNULL, stderr=err_file)
        first = _wait_first_row(proc, metrics, t0)
    total = time.perf_counter() - t0
    if proc.returncode != 0:
        raise BenchError(f"gptlab-train {' '.join(extra)} exited {proc.returncode}: {err.read_text()[-300:]}")
    return {"first_step_s": first, "total_s": total, "foreign": meter.foreign}


def _wait_first_row(proc, metrics: Path, t0: float) -> float | None:
    """Poll until the process exits; the time its first train row appeared."""
    first = None
    while proc.poll() is None:
        if first is None and metrics.is_file() and '"train/loss"' in metrics.read_text():
            first = time.perf_counter() - t0
        time.sleep(0.005)
    return first


def sweep_overhead(bench: Bench, s: dict, launcher: str, out: Path) -> dict:
    """Wall time of a whole gptlab-sweep vs the sum of its runs' own training time."""
    sweep_dir = out / f"sweep-{launcher}"
    extra = [*s["sweep_extra"], *(["launcher=local"] if launcher.startswith("local") else [])]
    flags = ["--fresh-interpreters"] if launcher == "local-fresh" else []
    cmd = [*gptlab("sweep"), s["sweep"], *extra, "--seeds", s["seeds"], "--out", str(sweep_dir), *flags]
    wall, _ = run(bench, cmd)
    summaries = sorted(sweep_dir.glob("*/seed*/summary.json"))
    if not summaries:
        raise BenchError(f"{sweep_dir}: the sweep wrote no summary.json")
    own = sum(read_json(p)["wall_s"] for p in summaries)
    n = len(summaries)
    overhead = (wall - own) / n
    return {
        "launcher": launcher,
        "label": LAUNCHERS[launcher],
        "runs": n,
        "wall_s": wall,
        "runs_own_s": own,
        "per_run_overhead_s": overhead,
    }


def _median_sweep(rows: list[dict]) -> dict:
    """One launcher's rounds: the medians, with the per-run overhead's range over the rounds."""
    overheads = [r["per_run_overhead_s"] for r in rows]
    summary = {k: median(r[k] for r in rows) for k in ("wall_s", "runs_own_s", "per_run_overhead_s")}
    return {**rows[0], **summary, "rounds": len(rows), "per_run_overhead_range_s": [min(overheads), max(overheads)]}


def measure(bench: Bench) -> dict:
    s = sizes(bench)
    out = bench.dir("startup")
    bench.log("startup: import times, cold and warm first steps")
    imports = [import_times(bench) for _ in range(s["repeats"])]
    base_wall = [run(bench, [sys.executable, "-c", "pass"])[0] for _ in range(s["repeats"])]
    cache = str(out / "cache")  # empty at first: the first run tokenizes the corpus and measures the peak
    wait_quiet(bench, s["wait"])
    cold = first_step(bench, out, [], GPTLAB_CACHE=cache)
    warm = {name: [] for name in CASES}
    for _ in range(s["repeats"]):  # interleaved
        wait_quiet(bench, s["wait"])
        for name, extra in CASES.items():
            warm[name].append(first_step(bench, out, extra, GPTLAB_CACHE=cache))
    compiled = first_step(
        bench,
        out,
        ["logger=none", "hardware.compile=true"],
        GPTLAB_CACHE=cache,
        TORCHINDUCTOR_CACHE_DIR=str(out / "inductor-cache"),
    )  # an empty one: a real compile
    samples: dict[str, list[dict]] = {launcher: [] for launcher in s["launchers"]}
    for r in range(s["repeats"]):  # interleaved rounds: a drift in the machine's speed hits every launcher alike
        wait_quiet(bench, s["wait"])
        for launcher in s["launchers"]:
            bench.log(f"startup: gptlab-sweep {s['sweep']} with launcher={launcher} (round {r + 1})")
            samples[launcher].append(sweep_overhead(bench, s, launcher, out / f"round{r}"))
    sweeps = [_median_sweep(rows) for rows in samples.values()]
    rows = [{"case": "cold cache, default (W&B offline)", **cold}]
    for name, samples in warm.items():
        used = quiet(samples, min_n=1)
        rows.append(
            {
                "case": f"warm cache, {name}",
                "first_step_s": median(x["first_step_s"] for x in used),
                "total_s": median(x["total_s"] for x in used),
                "foreign": median(x["foreign"] for x in used),
            }
        )
    rows.append({"case": "warm cache, logger=none hardware.compile=true", **compiled})
    return {
        "setup": {
            "repeats": s["repeats"],
            "model_overrides": ["model=tiny", *s["model"]],
            "sweep": s["sweep"],
            "sweep_overrides": s["sweep_extra"],
        },
        "python_startup_s": median(base_wall),
        "imports_s": {m: median(i.get(m) for i in imports) for m in MODULES},
        "first_step": rows,
        "sweeps": sweeps,
        "target_s": 3.0,
        "foreign_cpu": median(r["foreign"] for r in rows),
    }


def markdown(res: dict) -> str:
    model = " ".join(res["setup"].get("model_overrides", ["model=tiny"]))  # the quick run's is smaller
    lines = [f"| `gptlab-train {model}` | command → first optimizer step (s) | whole command (s) |", "|---|---|---|"]
    lines += [f"| {r['case']} | {_s(r['first_step_s'])} | {_s(r['total_s'])} |" for r in res["first_step"]]
    lines += [
        "",
        "Import cost, cumulative, in this order in one process (`python -X importtime`; "
        f"bare `python -c pass`: {res['python_startup_s']:.2f} s):",
        "",
        "| " + " | ".join(f"`{m}`" for m in MODULES) + " |",
        "|" + "---|" * len(MODULES),
        "| " + " | ".join(_s(res["imports_s"][m]) for m in MODULES) + " |",
        "",
        f"`gptlab-sweep {res['setup']['sweep']} {' '.join(res['setup']['sweep_overrides'])} --seeds 0`"
        f" (medians of {res['sweeps'][0].get('rounds', 1)} interleaved rounds; the overhead's range over them):",
        "",
        "| launcher | runs | sweep wall s | Σ runs' own training s | overhead per run s |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {w.get('label', w['launcher'])} | {w['runs']} | {w['wall_s']:.1f} | {w['runs_own_s']:.1f} | "
        f"{w['per_run_overhead_s']:.1f}{_range(w.get('per_run_overhead_range_s'))} |"
        for w in res["sweeps"]
    ]
    return "\n".join(lines)


def _range(span) -> str:
    return f" ({span[0]:.1f}–{span[1]:.1f})" if span and span[0] != span[1] else ""


def _s(v):
    return "n/a" if v is None else f"{v:.2f}"
