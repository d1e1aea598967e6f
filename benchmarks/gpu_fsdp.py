"""`make gpu-check`'s FSDP check through the real gptlab-train: hardware=fsdp on 2 GPUs (bf16 params, fp32
reduce-scatter) against one GPU, a resume on 2 ranks and on 1, and both ranks killed with SIGKILL mid-run, then
resumed. Takes (bench, sizes) like gpu_runs' checks; skipped with the reason where fewer than 2 GPUs are visible.

Tolerances: FSDP2 computes in bf16 parameters while one GPU runs fp32 weights under bf16 autocast, so the two
curves differ by bf16 rounding: final val loss within 3 % (as fp16_vs_bf16). A resume on the same world size is
held to the run-to-run noise of two uninterrupted fsdp runs (GPU kernels are not bitwise deterministic) + 1e-3.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time

import torch

from benchmarks.common import Bench, read_rows
from benchmarks.gpu_runs import SMALL, _brief, train

RANKS = 2
TWO = ("--standalone", f"--nproc_per_node={RANKS}")


def _args(steps: int) -> list[str]:
    return ["train.batch_size=16", f"train.ckpt_interval={steps // 2}", "hardware.dtype=bf16"]


def _copy_to(bench: Bench, src: str, name: str, keep_step: int) -> None:
    """<gpu>/name: a copy of run <gpu>/src as a kill right after checkpoint keep_step would leave it."""
    from gptlab.state import checkpoint

    dest = bench.dir("gpu") / name
    shutil.copytree(bench.dir("gpu") / src, dest, ignore=shutil.ignore_patterns(".gptlab.lock"))
    for path in checkpoint.ckpt_dir(dest).iterdir():
        m = checkpoint.PATTERN.search(path.name)
        if m and int(m.group(1)) > keep_step:
            shutil.rmtree(path)
    (dest / "summary.json").unlink()


def _kill_mid_run(bench: Bench, name: str, steps: int) -> dict:
    """Both ranks started with torchrun's env, SIGKILLed after the middle checkpoint; every checkpoint left loads."""
    from gptlab.state import checkpoint

    run_dir = bench.dir("gpu") / name
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(RANKS):
        env = bench.env | {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(RANKS),
            "LOCAL_WORLD_SIZE": str(RANKS),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gptlab.cli.train",
                    *SMALL,
                    f"train.max_steps={steps}",
                    f"train.eval_interval={max(1, steps // 2)}",
                    "hardware=fsdp",
                    *_args(steps),
                    f"hydra.run.dir={run_dir}",
                ],
                env=env,
                cwd=bench.work,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    deadline = time.time() + 1800
    while time.time() < deadline and all(p.poll() is None for p in procs):
        rows = read_rows(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").is_file() else []
        if max((r["step"] for r in rows), default=-1) > steps // 2:
            break
        time.sleep(0.01)
    for proc in procs:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    left = sorted(checkpoint.ckpt_dir(run_dir).glob("step_*.dcp"))
    return {
        "killed": all(p.returncode == -signal.SIGKILL for p in procs),
        "checkpoints": [checkpoint.load(p)["step"] for p in left],
    }  # raises on a half-written one


def _gap(a: dict, b: dict) -> float:
    return max(abs(a["val"][s] - v) for s, v in b["val"].items())


def check_fsdp(bench: Bench, sizes: dict) -> dict:
    """2 GPUs under hardware=fsdp vs 1 GPU; resume 2 -> 2 and 2 -> 1; SIGKILL of both ranks, then resume."""
    n = torch.cuda.device_count()
    if n < RANKS:
        return {"ok": True, "skipped": True, "detail": f"{n} GPU here: FSDP over {RANKS} ranks needs {RANKS} GPUs"}
    steps = sizes["long_steps"]
    one = train(bench, "fsdp-1gpu", "hardware=cuda", *_args(steps), steps=steps)
    two = train(bench, "fsdp-2", "hardware=fsdp", *_args(steps), steps=steps, launcher=TWO)
    again = train(bench, "fsdp-2-again", "hardware=fsdp", *_args(steps), steps=steps, launcher=TWO)
    noise = _gap(two, again)
    _copy_to(bench, "fsdp-2", "fsdp-resume-2", steps // 2)
    same = train(bench, "fsdp-resume-2", "hardware=fsdp", *_args(steps), steps=steps, launcher=TWO)
    _copy_to(bench, "fsdp-2", "fsdp-resume-1", steps // 2)
    fewer = train(
        bench,
        "fsdp-resume-1",
        "hardware=fsdp",
        *_args(steps),
        steps=steps,
        launcher=("--standalone", "--nproc_per_node=1"),
    )
    kill = _kill_mid_run(bench, "fsdp-kill", steps)
    killed = train(bench, "fsdp-kill", "hardware=fsdp", *_args(steps), steps=steps, launcher=TWO)
    a, b = one["final_val_loss"], two["final_val_loss"]
    rows = {
        "vs_one_gpu": abs(b - a) / a,
        "noise": noise,
        "resume_2_to_2": _gap(same, two),
        "resume_2_to_1": abs(fewer["final_val_loss"] - b) / b,
        "after_kill": _gap(killed, two),
        "kill": kill,
    }
    ok = (
        rows["vs_one_gpu"] <= 0.03
        and rows["resume_2_to_2"] <= noise + 1e-3
        and rows["resume_2_to_1"] <= 0.03
        and kill["killed"]
        and rows["after_kill"] <= noise + 1e-3
    )
    mem = {k: v["peak_mem_bytes"] for k, v in (("one_gpu", one), ("fsdp_rank0", two))}
    return {
        "ok": ok,
        **rows,
        "peak_mem_bytes": mem,
        "runs": {"one_gpu": _brief(one), "fsdp": _brief(two)},
        "detail": f"{steps} steps bf16: final val loss 1 GPU {a:.4f}, fsdp x{RANKS} {b:.4f}; |Δ val| resume 2->2 "
        f"{rows['resume_2_to_2']:.1e}, after kill -9 {rows['after_kill']:.1e} (run-to-run {noise:.1e}); "
        f"2->1 final {100 * rows['resume_2_to_1']:.2f} %; peak memory rank 0 "
        f"{mem['fsdp_rank0'] / 2**30:.2f} GiB vs one GPU {mem['one_gpu'] / 2**30:.2f} GiB",
    }
