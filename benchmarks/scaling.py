"""6. Scaling: tokens/s and peak memory vs sequence length and vs batch size, naive vs sdpa attention.

Each point runs in its own process (`python -m benchmarks.scaling '<json>'`), because on CPU peak memory is
the process's peak resident set (what metrics.jsonl reports too); "training memory" is the peak during the
steps (the kernel's mark is reset just before them) minus the resident set then: activations, gradients
and optimizer state, not the transient of loading the corpus.
naive and sdpa alternate at every point.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

from benchmarks.common import Bench, CpuMeter, median, run

MODEL = ["model=tiny", "model.d_model=256", "model.n_head=8", "model.n_layer=2", "hardware.dtype=auto"]
MODEL_QUICK = ["model=tiny", "model.d_model=64", "model.n_head=4", "model.n_layer=1", "hardware.dtype=auto"]
IMPLS = ("naive", "sdpa")


def sizes(bench: Bench) -> dict:
    full = dict(
        model=MODEL, seq=[128, 256, 512, 1024, 2048], seq_batch=4, batch=[1, 2, 4, 8, 16], batch_seq=512, steps=3
    )
    quick = dict(model=MODEL_QUICK, seq=[32, 64], seq_batch=2, batch=[1, 2], batch_seq=64, steps=2)
    return bench.pick(full, quick)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark to the current RSS (Linux clear_refs), so loading data doesn't count."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_bytes(was_reset: bool) -> int:
    """Peak RSS since the reset (VmHWM), else since the process started (ru_maxrss)."""
    if was_reset:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(point: dict) -> dict:
    """Build the model as gptlab-train does, run 1 warm-up + `steps` timed steps; speed and memory."""
    import torch

    from benchmarks.common import bare_step, build_platform
    from gptlab.runtime.threads import threads_for_job

    torch.set_num_threads(threads_for_job())
    overrides = [
        *point["model"],
        f"model.block_size={point['seq']}",
        f"train.batch_size={point['batch']}",
        f"attention.impl={point['impl']}",
    ]
    b = build_platform(overrides)
    x, y = b["data"].train_samples(0, point["batch"])
    before, was_reset = _rss_bytes(), _reset_peak()
    times = []
    for _ in range(point["steps"] + 1):
        t0 = time.perf_counter()
        bare_step(b["model"], b["forward"], b["optimizer"], b["hardware"].autocast, x, y, b["grad_clip"])
        times.append(time.perf_counter() - t0)
    peak = _peak_bytes(was_reset)
    step_s = median(times[1:])
    return {
        "step_ms": 1000 * step_s,
        "tokens_per_s": point["batch"] * point["seq"] / step_s,
        "peak_mem_bytes": peak,
        "train_mem_bytes": max(0, peak - before),
    }


def _point(bench: Bench, s: dict, impl: str, seq: int, batch: int) -> dict:
    point = {"model": s["model"], "impl": impl, "seq": seq, "batch": batch, "steps": s["steps"]}
    with CpuMeter() as meter:
        _, out = run(bench, [sys.executable, "-m", "benchmarks.scaling", json.dumps(point)])
    return {
        "impl": impl,
        "seq": seq,
        "batch": batch,
        **json.loads(out.strip().splitlines()[-1]),
        "foreign": meter.foreign,
    }


def measure(bench: Bench) -> dict:
    s = sizes(bench)
    by_seq, by_batch = [], []
    for seq in s["seq"]:
        bench.log(f"scaling: T={seq}, batch {s['seq_batch']}")
        by_seq += [_point(bench, s, impl, seq, s["seq_batch"]) for impl in IMPLS]
    for batch in s["batch"]:
        bench.log(f"scaling: batch {batch}, T={s['batch_seq']}")
        reuse = [p for p in by_seq if p["seq"] == s["batch_seq"] and p["batch"] == batch]
        by_batch += reuse or [_point(bench, s, impl, s["batch_seq"], batch) for impl in IMPLS]
    return {
        "setup": {"model": s["model"], "steps": s["steps"], "seq_batch": s["seq_batch"], "batch_seq": s["batch_seq"]},
        "by_seq": by_seq,
        "by_batch": by_batch,
        "foreign_cpu": median(p["foreign"] for p in by_seq + by_batch),
    }


def _table(points: list[dict], key: str) -> list[str]:
    lines = [
        f"| {key} | naive tokens/s | sdpa tokens/s | sdpa speed-up | naive train mem MiB | "
        "sdpa train mem MiB | naive / sdpa mem |",
        "|---|---|---|---|---|---|---|",
    ]
    for value in sorted({p[key] for p in points}):
        n, f = (next(p for p in points if p[key] == value and p["impl"] == i) for i in IMPLS)
        lines.append(
            f"| {value} | {n['tokens_per_s']:,.0f} | {f['tokens_per_s']:,.0f} | "
            f"{f['tokens_per_s'] / n['tokens_per_s']:.2f}× | {n['train_mem_bytes'] / 2**20:,.0f} | "
            f"{f['train_mem_bytes'] / 2**20:,.0f} | "
            f"{n['train_mem_bytes'] / max(1, f['train_mem_bytes']):.1f}× |"
        )
    return lines


def markdown(res: dict) -> str:
    s = res["setup"]
    return "\n".join(
        [
            f"Model `{' '.join(s['model'])}`, the CPU's native dtype (hardware.dtype=auto: bf16 with AMX/AVX512-BF16, else fp32), fused AdamW; {s['steps']} timed steps after one warm-up, "
            "one process per point. Training memory = peak RSS during the steps − RSS before the first step.",
            "",
            f"By sequence length (batch {s['seq_batch']}):",
            "",
            *_table(res["by_seq"], "seq"),
            "",
            f"By batch size (T {s['batch_seq']}):",
            "",
            *_table(res["by_batch"], "batch"),
        ]
    )


if __name__ == "__main__":
    print(json.dumps(worker(json.loads(sys.argv[1]))))
