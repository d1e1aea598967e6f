"""`make gpu-check`'s one-GPU reliability and compile checks through the real gptlab-train: a run killed with SIGKILL
after its middle checkpoint and resumed (dropout 0.1, so the CUDA RNG state must come back too), its checkpoint
resumed on the CPU, and the three compile modes (eager, default, CUDA graphs) on the same run.

Tolerances: GPU kernels are not bitwise deterministic (atomics in the backward, autotuned tiles), so a resumed
curve is held to the run-to-run noise of two uninterrupted runs + 1e-3, and compile modes to 2 % of the eager
final val loss (compiled kernels fuse and round differently in bf16).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time

from benchmarks.common import Bench, read_rows
from benchmarks.gpu_runs import SMALL, _brief, train


def _args(steps: int, hardware: tuple[str, ...] = ("hardware=cuda",)) -> list[str]:
    return [*hardware, "model.dropout=0.1", f"train.ckpt_interval={steps // 2}"]


def _gap(a: dict, b: dict) -> float:
    return max(abs(a["val"][s] - v) for s, v in b["val"].items())


def _kill_after_middle(bench: Bench, name: str, steps: int, hardware: tuple[str, ...]) -> dict:
    """Start the run, SIGKILL it once a step past the middle checkpoint is logged; what the kill left."""
    from gptlab.state import checkpoint

    run_dir = bench.dir("gpu") / name
    cmd = [sys.executable, "-m", "gptlab.cli.train", *SMALL, f"train.max_steps={steps}"]
    cmd += [f"train.eval_interval={max(1, steps // 2)}", *_args(steps, hardware), f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(cmd, env=bench.env, cwd=bench.work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None:
        rows = read_rows(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").is_file() else []
        if max((r["step"] for r in rows), default=-1) > steps // 2:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    left = sorted(checkpoint.ckpt_dir(run_dir).glob("step_*.pt"))
    return {
        "killed": proc.returncode == -signal.SIGKILL,
        "checkpoints": [checkpoint.load(p)["step"] for p in left],  # raises on a half-written one
    }


def check_kill_resume(bench: Bench, sizes: dict, hardware: tuple[str, ...] = ("hardware=cuda",)) -> dict:
    """SIGKILL after the middle checkpoint, resume=auto on the GPU: the straight curve within run-to-run noise;
    the same checkpoint continued with hardware=cpu (train.init_from) finishes near it (it is not tied to the GPU).
    `hardware`: the runs' hardware overrides (the GPU study runs them eager)."""
    steps = sizes["long_steps"]
    a = train(bench, "resume-straight-0", *_args(steps, hardware), steps=steps)
    b = train(bench, "resume-straight-1", *_args(steps, hardware), steps=steps)
    noise = _gap(a, b)
    kill = _kill_after_middle(bench, "resume-killed", steps, hardware)
    from gptlab.state import checkpoint

    middle = bench.dir("gpu") / f"middle-step_{steps // 2}.pt"  # kept: the resumed run may prune its checkpoints
    shutil.copy(checkpoint.ckpt_dir(bench.dir("gpu") / "resume-killed") / f"step_{steps // 2:07d}.pt", middle)
    resumed = train(bench, "resume-killed", *_args(steps, hardware), steps=steps)
    after_kill = _gap(resumed, a)
    # The GPU's middle checkpoint started as a new run on the CPU (a resume under another hardware is refused as
    # another config; init_from is the way): it loads off the GPU and finishes near the GPU's curve.
    cpu = train(bench, "resume-on-cpu", "hardware=cpu", "model.dropout=0.1", f"train.init_from={middle}", steps=steps)
    cpu_rel = abs(cpu["final_val_loss"] - a["final_val_loss"]) / a["final_val_loss"]
    ok = (
        kill["killed"]
        and steps // 2 in kill["checkpoints"]
        and resumed["status"] == "finished"
        and after_kill <= noise + 1e-3
        and cpu["status"] == "finished"
        and cpu_rel <= 0.03
    )
    return {
        "ok": ok,
        "noise": noise,
        "after_kill": after_kill,
        "cpu_rel": cpu_rel,
        "kill": kill,
        "runs": {"straight": _brief(a), "resumed": _brief(resumed), "cpu": _brief(cpu)},
        "detail": f"{steps} steps, dropout 0.1, kill -9 after step {steps // 2}'s checkpoint: |Δ val| after resume "
        f"{after_kill:.1e} (run-to-run {noise:.1e}); that checkpoint continued on the CPU (init_from): final val loss "
        f"{cpu['final_val_loss']:.4f} vs {a['final_val_loss']:.4f} straight ({100 * cpu_rel:.2f} %)",
    }


def check_compile_modes(bench: Bench, sizes: dict) -> dict:
    """hardware.compile=false / true / reduce-overhead (CUDA graphs) on the same run: all finish, final val loss
    within 2 % of eager, and each one's speed (compile time excluded from step figures)."""
    steps = sizes["long_steps"]
    runs = {
        mode: train(bench, f"compile-{mode}", "hardware=cuda", f"hardware.compile={mode}", steps=steps)
        for mode in ("false", "true", "reduce-overhead")
    }
    eager = runs["false"]["final_val_loss"]
    rel = {m: abs(r["final_val_loss"] - eager) / eager for m, r in runs.items()}
    ok = all(r["status"] == "finished" for r in runs.values()) and max(rel.values()) <= 0.02
    return {
        "ok": ok,
        "rel_to_eager": rel,
        "runs": {m: _brief(r) for m, r in runs.items()},
        "detail": "; ".join(
            f"compile={m}: val {r['final_val_loss']:.4f}, {r.get('step_ms_median') or 0:.1f} ms/step"
            for m, r in runs.items()
        )
        + f" ({steps} steps, model=tiny)",
    }
