"""Speed timed alone vs speed read off training runs, through the user path (docs/COMPARE.md's before/after).

Part 1: three arms of identical cost (norm.eps only) x 3 seeds through the 2-slot local queue, with a busy loop
on one core the whole time: the training runs' own tokens/s (what reports used to judge speed by) against the
sweep's timing session (each arm alone, shuffled rounds, the baseline twice a round).
Part 2: the attention study (mha / gqa n_kv 2 / mqa, 1 seed) timed twice, in two sessions: the same verdicts,
ratios inside the FLOP caps.

Writes docs/timed_speed.json and prints Markdown rows. `python -m benchmarks.timed_speed [--quick]`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
OUT = ROOT / "docs" / "timed_speed.json"
TINY = [
    "train.batch_size=8",
    "train.eval_interval=20",
    "train.eval_sequences=16",
    "logger=none",
    "train.log_interval=5",
]


def _sweep(path: Path, arms: dict, seeds: list[int], overrides: list[str]) -> Path:
    path.write_text(
        yaml.safe_dump(
            {"description": path.stem, "seeds": seeds, "overrides": overrides, "arms": arms}, sort_keys=False
        )
    )
    return path


def _run(*argv: str, env: dict | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def _rows(report_dir: Path) -> list[dict]:
    return json.loads((report_dir / "comparison.json").read_text())["rows"]


def _speed(row: dict) -> dict:
    """One arm's figures: the training runs' own ratio (records) and the timed verdict."""
    v = row.get("speed") or {}
    return {
        "label": row["label"],
        "training_tokens_per_s": row.get("tokens_per_s_seeds"),
        "timed_tokens_per_s": row.get("timed_tokens_per_s"),
        "timed_speedup": row.get("speedup"),
        "timed_interval": row.get("speedup_ci"),
        "status": v.get("status"),
        "aa": row.get("speed_aa"),
        "flops_per_token": row.get("flops_per_token"),
    }


def _training_ratio(rows: list[dict]) -> list[float | None]:
    """Each arm's training-run geometric mean tokens/s over the baseline's (what the old reports called the
    speed-up)."""

    def g(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None

    base = g(rows[0].get("tokens_per_s_seeds") or [])
    return [None if not base or not (x := g(r.get("tokens_per_s_seeds") or [])) else x / base for r in rows]


def identical_cost(work: Path, steps: int, seeds: int) -> dict:
    """Part 1: norm.eps arms through the packed queue under a busy core."""
    arms = {"eps5": ["norm.eps=1e-5"], "eps6": ["norm.eps=1e-6"], "eps4": ["norm.eps=1e-4"]}
    sweep = _sweep(work / "eps.yaml", arms, list(range(seeds)), [f"train.max_steps={steps}", *TINY])
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        started = time.time()
        _run(str(BIN / "gptlab-sweep"), str(sweep), "--out", str(work / "eps"), env={"GPTLAB_SWEEP_TIMING": "on"})
        took = time.time() - started
    finally:
        busy.kill()
        busy.wait()
    _run(str(BIN / "gptlab-compare"), str(work / "eps"), "--out", str(work / "eps_report"))
    rows = _rows(work / "eps_report")
    return {"arms": [_speed(r) for r in rows], "training_ratio": _training_ratio(rows), "seconds": took}


def attention_twice(work: Path, steps: int) -> dict:
    """Part 2: mha / gqa2 / mqa, one seed, timed in two sessions."""
    arms = {"mha": ["attention=mha"], "gqa2": ["attention=gqa", "attention.n_kv_head=2"], "mqa": ["attention=mqa"]}
    size = ["model.n_head=8", "model.d_model=256", "model.block_size=256", "model.n_layer=2"]
    sweep = _sweep(work / "attn.yaml", arms, [0], [*size, f"train.max_steps={steps}", *TINY])
    out = work / "attn"
    _run(str(BIN / "gptlab-sweep"), str(sweep), "--out", str(out), env={"GPTLAB_SWEEP_TIMING": "on"})
    sessions = []
    for k in range(2):
        if k:  # the second session: the first set aside, every arm timed again
            shutil.move(out / "timing.json", work / "timing-first.json")
            _run(str(BIN / "gptlab-sweep"), "time", str(out))
        _run(str(BIN / "gptlab-compare"), str(out), "--out", str(work / f"attn_report{k}"))
        sessions.append([_speed(r) for r in _rows(work / f"attn_report{k}")])
    return {"sessions": sessions}


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and seeds (a check that it runs)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="timed-speed-") as tmp:
        work = Path(tmp)
        doc = {
            "machine": _cpu(),
            "cores": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d"),
            "identical_cost": identical_cost(work, 40 if args.quick else 100, 2 if args.quick else 3),
            "attention": attention_twice(work, 20 if args.quick else 40),
        }
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
