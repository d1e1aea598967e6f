"""Sweep launch, measured: the old per-arm serial launch vs gptlab-sweep's one launch, and a local sweep started all
at once vs packed by the local queue. Wall times side by side in one run, with how many runs ran at once.

    python -m benchmarks.sweep_launch --slurm      (needs `eval "$(scripts/slurm-cluster.sh env)"` first)
    python -m benchmarks.sweep_launch --local

Prints a Markdown table for docs/BENCHMARKS.md, with the machine's outside load over each measurement.
SLURM, "serial": one `gptlab-train -m launcher=slurm` per arm, each waiting for its arm's jobs (what gptlab-sweep
did before it launched a sweep as one job array). Local, "all at once": `gptlab-train -m launcher=local` (submitit's
local executor starts every run at once, each taking every core as torch threads).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from gptlab.runtime.cpu_load import job_sampler

ARMS = {"mha": ["attention=mha"], "gqa2": ["attention=gqa", "attention.n_kv_head=2"], "mqa": ["attention=mqa"]}
ARMS["sliding"] = ["attention=sliding", "attention.window=16"]
TINY = [
    "model.n_layer=2", "model.d_model=64", "model.n_head=4", "model.block_size=64", "train.batch_size=8",
    "train.eval_sequences=16", "sample.tokens=0", "logger=none", "hardware.dtype=fp32", "hardware.peak_flops=1e12",
    "train.max_steps=150", "train.eval_interval=150",
]  # fmt: skip


def _timed(cmd: list[str], env: dict, cwd: Path) -> tuple[float, float | None]:
    """(wall seconds, outside load share) of one command run to its end (it must succeed)."""
    sampler = job_sampler(1)
    sampler.start()
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    sampler.sample(force=True)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{done.stderr[-2000:]}")
    load = sampler.outside_ticks / sampler.total_ticks if sampler.total_ticks else None
    return wall, load


def _max_concurrent(root: Path) -> int:
    """Most runs training at the same moment, from each run's provenance start and summary wall time."""
    spans = []
    for summary in root.rglob("summary.json"):
        prov = summary.parent / "provenance.json"
        end = summary.stat().st_mtime
        start = prov.stat().st_mtime if prov.exists() else end - json.loads(summary.read_text()).get("wall_s", 0)
        spans.append((start, end))
    return max((sum(1 for s, e in spans if s <= t < e) for t, _ in spans), default=0)


def _sweep_file(work: Path, seeds: list[int], extra: list[str]) -> Path:
    path = work / "bench.yaml"
    path.write_text(yaml.safe_dump({"seeds": seeds, "overrides": [*TINY, *extra], "arms": ARMS}, sort_keys=False))
    return path


def slurm(work: Path) -> list[tuple]:
    env = dict(os.environ, SLURM_PARTITION=os.environ.get("SLURM_PARTITION", "debug"))
    slot = ["hardware.cpus_per_task=1", "hardware.threads=1"]  # 2 runs at once on a 2-CPU cluster
    py = [sys.executable, "-m"]
    rows = []
    for _ in range(2):  # interleaved: serial, one launch, serial, one launch
        serial = work / f"serial{len(rows)}"
        wall_s, load_s = 0.0, []
        for arm, overrides in ARMS.items():
            cmd = [*py, "gptlab.cli.train", "-m", "launcher=slurm", *TINY, *slot, *overrides, "seed=0,1"]
            cmd += [f"hydra.sweep.dir={serial}", f"hydra.sweep.subdir={arm}/seed${{seed}}"]
            w, ld = _timed(cmd, env, work)
            wall_s, load_s = wall_s + w, [*load_s, ld]
        rows.append(("serial per arm", wall_s, max((x or 0) for x in load_s), _max_concurrent(serial)))
        one = work / f"one{len(rows)}"
        w, ld = _timed(
            [*py, "gptlab.cli.sweep", str(_sweep_file(work, [0, 1], slot)), "--out", str(one), "launcher=slurm"],
            env,
            work,
        )
        rows.append(("one launch (job array)", w, ld or 0, _max_concurrent(one)))
    return rows


def local(work: Path) -> list[tuple]:
    py = [sys.executable, "-m"]
    rows = []
    for _ in range(2):
        allatonce = work / f"all{len(rows)}"
        cmd = [*py, "gptlab.cli.train", "-m", "launcher=local", *TINY, "attention=mha,mqa", "seed=0,1,2,3"]
        w, ld = _timed([*cmd, f"hydra.sweep.dir={allatonce}"], dict(os.environ), work)
        rows.append(("all at once (launcher=local)", w, ld or 0, _max_concurrent(allatonce)))
        packed = work / f"packed{len(rows)}"
        spec = _sweep_file(work, [0, 1, 2, 3], [])
        spec.write_text(
            yaml.safe_dump({**yaml.safe_load(spec.read_text()), "arms": {a: ARMS[a] for a in ("mha", "mqa")}})
        )
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "GPTLAB_THREADS")}
        w, ld = _timed([*py, "gptlab.cli.sweep", str(spec), "--out", str(packed)], env, work)
        rows.append(("packed (local queue)", w, ld or 0, _max_concurrent(packed)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slurm", action="store_true")
    parser.add_argument("--local", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows = (slurm(work) if args.slurm else []) + (local(work) if args.local else [])
    print("| launch | wall s | runs at once | outside load |\n|---|---|---|---|")
    for name, wall, load, most in rows:
        print(f"| {name} | {wall:.1f} | {most} | {load:.0%} |")


if __name__ == "__main__":
    main()
