"""data.doc_mask's speed cost per attention kernel on this machine, measured as gptlab measures speed.

For each kernel (sdpa and naive; flex trains only on a GPU): two short gptlab-train runs of one model, with and
without `data.doc_mask=true`, then one timing session over the pair (gptlab/train/timing.py: each arm rebuilt as its
run built it, warm-up steps excluded, interleaved rounds in a shuffled order, the unmasked baseline timed twice per
round as the A/A control). The figure per kernel is the paired speed-up of the masked arm (masked tokens/s over the
unmasked), its 95% interval and p over the rounds, beside the A/A ratio that bounds what noise alone gives, the
median step time of each arm and the machine's load over the session.

`python -m benchmarks.doc_mask [--quick] [--out PATH] [--work DIR]`; writes a JSON (default docs/doc_mask.json) and
prints one line per kernel. The two arms build one model (the mask is data, not a weight), so the timing session and
gptlab-compare would call them the identical model: this script reads the rounds itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gptlab.compare.statistics.rounds import round_rates, session_speeds
from gptlab.train.timing import Arm, Plan, run_session
from gptlab.util.io import strict_json

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
KERNELS = ("sdpa", "naive")
# the model a window times: 4 layers at width 128 over 256-token windows, where the T x T mask is not negligible
MODEL = ["model=tiny", "model.block_size=256", "train.batch_size=8", "hardware.dtype=fp32", "train.prefetch=0"]
QUICK = ["model=tiny", "model.n_layer=2", "model.block_size=64", "train.batch_size=4", "hardware.dtype=fp32"]


def _train(run_dir: Path, overrides: list[str], env: dict) -> None:
    """A 2-step gptlab-train run (the timing session rebuilds the arm from its saved config)."""
    argv = [
        str(BIN / "gptlab-train"),
        *overrides,
        "train.max_steps=2",
        "train.eval_interval=2",
        "train.eval_sequences=4",
    ]
    argv += ["logger=none", "sample.tokens=0", f"hydra.run.dir={run_dir}"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _arm_figures(doc: dict, arm: str) -> dict:
    """An arm's own windows: median step ms and tokens/s, and the outside load over them."""
    own = [w for w in doc["windows"] if w["arm"] == arm and not w["repeat"]]
    loads = [w.get("outside_load") for w in own if w.get("outside_load") is not None]
    return {
        "step_ms_median": statistics.median(w["step_ms_median"] for w in own),
        "tokens_per_s_median": statistics.median(w["tokens_per_s"] for w in own),
        "outside_load_mean": statistics.mean(loads) if loads else None,
    }


def time_kernel(kernel: str, work: Path, model: list[str], plan: dict, env: dict) -> dict:
    """Train the unmasked and masked arm of `kernel`, time them in one session, read the paired speed-up."""
    arms = {kernel: [], f"{kernel}+doc_mask": ["data.doc_mask=true"]}
    for name, extra in arms.items():
        _train(work / name, [*model, f"attention.impl={kernel}", *extra], env)
    before, started = _loadavg(), time.time()
    doc = run_session(Plan(tuple(Arm(n, work / n) for n in arms), **plan), work / f"session-{kernel}")
    masked = f"{kernel}+doc_mask"
    speed = session_speeds(round_rates(doc["windows"]), kernel)[masked]
    assert speed.speedup is not None and speed.aa is not None  # every round holds both arms and the A/A window
    return {
        "kernel": kernel,
        "masked_over_unmasked_tokens_per_s": speed.speedup.ratio,
        "interval_95": speed.speedup.interval,
        "p": speed.speedup.p,
        "aa_ratio": speed.aa.ratio,
        "aa_interval_95": speed.aa.interval,
        "rounds": speed.speedup.rounds,
        "unmasked": _arm_figures(doc, kernel),
        "masked": _arm_figures(doc, masked),
        "loadavg_before": before,
        "loadavg_after": _loadavg(),
        "session_s": time.time() - started,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.doc_mask", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks the script, not figures")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "doc_mask.json")
    p.add_argument("--work", type=Path, help="keep the runs and sessions here (default: a temp dir)")
    args = p.parse_args(argv)
    plan = dict(rounds=2, steps=3, warmup=1) if args.quick else dict(rounds=8, steps=12, warmup=3)
    model = QUICK if args.quick else MODEL
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        results = [time_kernel(k, work, model, plan, env) for k in KERNELS]
    record = {"model": model, "plan": plan, "cpu_count": os.cpu_count(), "kernels": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(strict_json(record), indent=1) + "\n")
    for r in results:
        lo, hi = r["interval_95"] or (None, None)
        print(
            f"{r['kernel']}: masked/unmasked tokens/s {r['masked_over_unmasked_tokens_per_s']:.3f} "
            f"[{lo:.3f}, {hi:.3f}] p={r['p']:.3g}, A/A {r['aa_ratio']:.3f}, step "
            f"{r['unmasked']['step_ms_median']:.1f} -> {r['masked']['step_ms_median']:.1f} ms, "
            f"load {r['loadavg_before']:.2f} -> {r['loadavg_after']:.2f}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
