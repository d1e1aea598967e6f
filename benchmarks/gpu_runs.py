"""GPU checks through the real gptlab-train CLI: hardware=cuda/auto, TF32 on/off under -W error, fp16 vs bf16,
torchrun DDP over every GPU present vs one GPU, and profile=true leaving the curve unchanged.

Each check takes (bench, sizes) and returns {"ok": bool, "detail": one line, ...figures}.
"""

from __future__ import annotations

import re
import sys

import torch

from benchmarks.common import Bench, read_json, read_rows, run

SMALL = ["model=tiny", "logger=none", "sample.tokens=0", "train.log_interval=1"]


def train(bench: Bench, name: str, *overrides: str, steps: int, python_flags: tuple = (), launcher: tuple = ()) -> dict:
    """One gptlab-train run into <work>/<name>; its summary plus {step: val loss} and {step: train loss}."""
    run_dir = bench.dir("gpu") / name
    cmd = [sys.executable, *python_flags]
    if launcher:  # torchrun: python -m torch.distributed.run <launcher args> -m gptlab.cli.train ...
        cmd += ["-m", "torch.distributed.run", *launcher]
    schedule = [f"train.max_steps={steps}", f"train.eval_interval={max(1, steps // 2)}"]
    args = cmd + ["-m", "gptlab.cli.train", *SMALL, *schedule, *overrides, f"hydra.run.dir={run_dir}"]
    run(bench, args, stderr_to=bench.dir("gpu") / f"{name}.stderr")
    rows = read_rows(run_dir / "metrics.jsonl")
    return read_json(run_dir / "summary.json") | {
        "val": {r["step"]: r["val/loss"] for r in rows if "val/loss" in r},
        "train": {r["step"]: r["train/loss"] for r in rows if "train/loss" in r},
    }


def _speed(s: dict) -> str:
    mfu = s.get("mfu_median")
    return f"{s.get('tokens_per_s_median') or 0:,.0f} tok/s, MFU {100 * mfu:.1f}%" if mfu is not None else "no MFU"


def check_train_cli(bench: Bench, sizes: dict) -> dict:
    """`gptlab-train hardware=cuda` and `hardware=auto` train `steps` steps; MFU within (0, 1]."""
    runs = {hw: train(bench, f"cli-{hw}", f"hardware={hw}", steps=sizes["steps"]) for hw in ("cuda", "auto")}
    ok = all(
        s["status"] == "finished" and s["steps"] == sizes["steps"] and 0 < (s.get("mfu_median") or 0) <= 1
        for s in runs.values()
    )
    return {
        "ok": ok,
        "runs": {k: _brief(v) for k, v in runs.items()},
        "detail": "; ".join(
            f"hardware={k}: {v['status']} after {v['steps']} steps, {_speed(v)}" for k, v in runs.items()
        ),
    }


TF32_WARNING = re.compile(r"warn.*(tf32|fp32_precision)|(tf32|fp32_precision).*(deprecat|warn)", re.IGNORECASE)


def check_tf32_mfu(bench: Bench, sizes: dict) -> dict:
    """fp32 with TF32 on and off under `python -W always`: no TF32 / fp32_precision warning on stderr (the old
    allow_tf32 flags warn on torch >= 2.9), MFU <= 1 each. Not `-W error`: any third-party deprecation warning in
    the image (torch.jit.script_method, seen on the H100's torch 2.11) would fail the run for a reason not ours."""
    runs, warned = {}, {}
    for tf32 in ("true", "false"):
        name = f"tf32-{tf32}"
        runs[tf32] = train(
            bench,
            name,
            "hardware=cuda",
            "hardware.dtype=fp32",
            f"hardware.tf32={tf32}",
            steps=sizes["steps"],
            python_flags=("-W", "always"),
        )
        lines = (bench.dir("gpu") / f"{name}.stderr").read_text().splitlines()
        warned[tf32] = [line.strip() for line in lines if TF32_WARNING.search(line)]
    ok = all(s["status"] == "finished" and 0 < (s.get("mfu_median") or 0) <= 1 for s in runs.values())
    ok = ok and not any(warned.values())
    found = "; ".join(f"tf32={k}: {v[0][:160]}" for k, v in warned.items() if v)
    return {
        "ok": ok,
        "warnings": warned,
        "runs": {k: _brief(v) for k, v in runs.items()},
        "detail": "; ".join(f"tf32={k}: {_speed(v)}" for k, v in runs.items())
        + (f"; TF32 warning: {found}" if found else " (no TF32 warning under -W always)"),
    }


def check_fp16_vs_bf16(bench: Bench, sizes: dict) -> dict:
    """fp16 (with its gradient scaler) follows the bf16 curve: final val loss within 3 %."""
    steps = sizes["long_steps"]
    runs = {
        dt: train(bench, f"dtype-{dt}", "hardware=cuda", f"hardware.dtype={dt}", steps=steps) for dt in ("bf16", "fp16")
    }
    a, b = runs["bf16"]["final_val_loss"], runs["fp16"]["final_val_loss"]
    ok = all(s["status"] == "finished" for s in runs.values()) and abs(b - a) <= 0.03 * a
    return {
        "ok": ok,
        "runs": {k: _brief(v) for k, v in runs.items()},
        "detail": f"{steps} steps: final val loss bf16 {a:.4f}, fp16 {b:.4f}",
    }


def _ddp_args(n: int, grad_accum: int) -> list[str]:
    """A global batch every rank and micro-step divides evenly."""
    return [
        f"train.batch_size={8 * n * grad_accum}",
        f"train.grad_accum={grad_accum}",
        "hardware.dtype=fp32",
        "hardware.tf32=false",
    ]


def check_ddp(bench: Bench, sizes: dict) -> dict:
    """torchrun over every GPU here (hardware=ddp) follows one GPU's losses: plain, grad_accum 4, compiled."""
    n = torch.cuda.device_count()
    if n < 2:
        return {"ok": True, "skipped": True, "detail": f"{n} GPU here: DDP needs 2 or more (not measured)"}
    rows, worst = {}, 0.0
    eager, compiled = ["hardware.compile=false"], ["hardware.compile=true"]  # GPU presets compile by default
    for label, accum, extra in (("plain", 1, eager), ("grad_accum 4", 4, eager), ("compile", 1, compiled)):
        args = [*_ddp_args(n, accum), *extra]
        tag = f"{accum}-{int(extra is compiled)}"
        one = train(bench, f"ddp1-{tag}", "hardware=cuda", *args, steps=sizes["steps"])
        many = train(
            bench,
            f"ddp{n}-{tag}",
            "hardware=ddp",
            *args,
            steps=sizes["steps"],
            launcher=("--standalone", f"--nproc_per_node={n}"),
        )
        diff = max(abs(many["val"][s] - v) for s, v in one["val"].items())
        rows[label] = {"max_val_loss_diff": diff, "one_gpu": _brief(one), f"{n}_gpus": _brief(many)}
        worst = max(worst, diff)
    return {
        "ok": worst <= 1e-3,
        "rows": rows,
        "detail": f"{n} GPUs vs 1: max |Δ val loss| {worst:.2e} (plain, grad_accum 4, compile; fp32, TF32 off)",
    }


def check_profile_unchanged(bench: Bench, sizes: dict) -> dict:
    """profile=true with dropout 0.1 leaves the curve where two unprofiled runs put it (GPU run-to-run noise)."""
    args = ["hardware=cuda", f"model={sizes['profile_model']}", "model.dropout=0.1", "train.batch_size=8"]
    steps = sizes["steps"] // 2
    a, b = (train(bench, f"profile-off{i}", *args, steps=steps) for i in (0, 1))
    p = train(bench, "profile-on", *args, "profile=true", steps=steps)
    noise = max(abs(a["train"][s] - b["train"][s]) for s in a["train"])
    diff = max(abs(a["train"][s] - p["train"][s]) for s in a["train"])
    return {
        "ok": diff <= noise + 1e-4,
        "profiled_diff": diff,
        "noise": noise,
        "peak_mem_bytes": {"off": a["peak_mem_bytes"], "on": p["peak_mem_bytes"]},
        "detail": f"{sizes['profile_model']}: max |Δ train loss| profiled {diff:.2e} vs run-to-run {noise:.2e}; "
        f"peak memory {a['peak_mem_bytes'] / 2**30:.2f} GiB off, {p['peak_mem_bytes'] / 2**30:.2f} on",
    }


def _brief(summary: dict) -> dict:
    keys = (
        "status",
        "steps",
        "final_val_loss",
        "tokens_per_s_median",
        "step_ms_median",
        "mfu_median",
        "peak_mem_bytes",
        "peak_flops",
    )
    return {k: summary.get(k) for k in keys}
