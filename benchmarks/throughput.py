"""2. Throughput and MFU per hardware dtype: fp32 vs bf16 autocast, eager vs hardware.compile=true, two model sizes.

Every arm is built as gptlab-train builds it (same overrides, model, fused AdamW, torch.compile of the model)
and stepped with the bare step of section 1 (which that section shows costs what the platform's does).
Arms are interleaved round by round; each timed chunk of steps sits between two matmul-peak probes of its
dtype, so MFU = useful training FLOP/s (the cost model's, as in metrics.jsonl) / the peak measured next to it.
"""

from __future__ import annotations

import time

from benchmarks.common import Bench, CpuMeter, PeakProbe, bare_step, build_platform, median, quiet, wait_quiet

GPT2S_FULL = ["model=gpt2", "model.n_layer=4", "model.block_size=512", "train.batch_size=4"]
GPT2S_QUICK = [
    "model=gpt2",
    "model.n_layer=1",
    "model.d_model=256",
    "model.n_head=4",
    "model.block_size=128",
    "train.batch_size=2",
]


DTYPE_X_MODE = [(d, c, None) for d in ("fp32", "bf16") for c in (False, True)]
# + the materialised attention compiled by Inductor, which beats torch's CPU flash kernel at T 512
NAIVE_COMPILED = ("bf16", True, "naive")


def sizes(bench: Bench) -> dict:
    """model name -> (overrides, steps per timed chunk, arms as (dtype, compiled, attention.impl or None))."""
    full = dict(
        rounds=5,
        warm=2,
        probe_n=2048,
        wait=15,
        models={"tiny": (["model=tiny"], 5, DTYPE_X_MODE), "gpt2s": (GPT2S_FULL, 1, [*DTYPE_X_MODE, NAIVE_COMPILED])},
    )
    quick_arms = [("fp32", False, None), ("bf16", False, None), ("bf16", True, None)]
    # 2 rounds: a CPU without native bf16 (AVX2 EPYC) runs the bf16 arms ~10x slower than fp32. The tiny model runs
    # eager only: gpt2s's compiled arms check the same compile code, and each cold compile costs ~10-25 s on 2 cores
    quick = dict(
        rounds=2,
        warm=2,
        probe_n=1024,
        wait=0,
        models={
            "tiny": (["model=tiny", "model.n_layer=2", "train.batch_size=8"], 3, quick_arms[:2]),
            "gpt2s": (GPT2S_QUICK, 1, [*quick_arms, NAIVE_COMPILED]),
        },
    )
    return bench.pick(full, quick)


class Arm:
    """One (model, dtype, eager|compile[, attention impl]) configuration with its own model, optimizer and batches."""

    def __init__(self, model_name: str, overrides: list[str], chunk: int, dtype: str, compiled: bool, impl: str | None):
        from gptlab.costs.report import train_flops_per_token

        self.name = f"{model_name} {dtype} {'compile' if compiled else 'eager'}" + (f" {impl}" if impl else "")
        self.model_name, self.dtype, self.compiled, self.impl, self.chunk = model_name, dtype, compiled, impl, chunk
        self.overrides = [
            *overrides,
            f"hardware.dtype={dtype}",
            f"hardware.compile={str(compiled).lower()}",
            *([f"attention.impl={impl}"] if impl else []),
        ]
        self.built = build_platform(self.overrides, compile_model=compiled)
        data = self.built["data"]
        self.tokens = self.built["batch_size"] * data.seq_len
        self.batches = [data.train_samples(i * self.built["batch_size"], self.built["batch_size"]) for i in range(4)]
        self.flops_per_token = float(train_flops_per_token(self.built["model"], data.seq_len))
        self.params = self.built["model"].num_params()
        m = self.built["cfg"].model  # causal attention's useful training FLOPs per token: 6 · n_layer · T · d_model
        self.attention_flops_share = 6 * m.n_layer * data.seq_len * m.d_model / self.flops_per_token
        self.samples, self.warm_s, self.i = [], None, 0  # samples: {step_s, mfu, foreign}

    def steps(self, n: int) -> float:
        """Seconds for n training steps."""
        b = self.built
        t0 = time.perf_counter()
        for _ in range(n):
            x, y = self.batches[self.i % len(self.batches)]
            bare_step(b["model"], b["forward"], b["optimizer"], b["hardware"].autocast, x, y, b["grad_clip"])
            self.i += 1
        return time.perf_counter() - t0


def attention_share(arm: Arm) -> float:
    """Share of one step's CPU self time spent in attention kernels (torch.profiler), for the reading."""
    from torch.profiler import profile

    with profile() as prof:
        arm.steps(1)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    attn = sum(e.self_cpu_time_total for e in events if "scaled_dot_product" in e.key or "attention" in e.key)
    return attn / total if total else 0.0


def measure(bench: Bench) -> dict:
    s = sizes(bench)
    probe = PeakProbe(s["probe_n"])
    arms = []
    for model_name, (overrides, chunk, variants) in s["models"].items():
        for variant in variants:
            arm = Arm(model_name, overrides, chunk, *variant)
            bench.log(f"throughput: warming up {arm.name}" + (" (torch.compile)" if arm.compiled else ""))
            arm.warm_s = arm.steps(s["warm"])
            arms.append(arm)
    for r in range(s["rounds"]):
        bench.log(f"throughput round {r + 1}/{s['rounds']}")
        wait_quiet(bench, s["wait"])
        for arm in arms:
            with CpuMeter() as meter:
                before = probe(arm.dtype)
                seconds = arm.steps(arm.chunk) / arm.chunk
                after = probe(arm.dtype)
            mfu = arm.flops_per_token * arm.tokens / seconds / ((before + after) / 2)
            arm.samples.append({"step_s": seconds, "mfu": mfu, "foreign": meter.foreign})
    shares = {a.name: attention_share(a) for a in arms if a.model_name == "gpt2s" and a.dtype == "bf16" and not a.impl}
    return _result(arms, probe, s, shares)


def _result(arms: list[Arm], probe: PeakProbe, s: dict, shares: dict) -> dict:
    """Rows from the rounds where no arm's chunk was disturbed by other processes (all rounds if < 2 were)."""
    peaks = probe.summary()
    best = best_peak(peaks)
    rounds = [
        r["r"]
        for r in quiet([{"r": r, "foreign": max(a.samples[r]["foreign"] for a in arms)} for r in range(s["rounds"])])
    ]
    rows = []
    for arm in arms:
        used = [arm.samples[r] for r in rounds]
        step_s = median(x["step_s"] for x in used)
        row = {
            "arm": arm.name,
            "model": arm.model_name,
            "dtype": arm.dtype,
            "compile": arm.compiled,
            "attention_impl": arm.impl or str(arm.built["cfg"].attention.impl),
            "params": arm.params,
            "tokens_per_step": arm.tokens,
            "flops_per_token": arm.flops_per_token,
            "step_ms": 1000 * step_s,
            "tokens_per_s": arm.tokens / step_s,
            "mfu": median(x["mfu"] for x in used),
            "mfu_vs_best_peak": arm.flops_per_token * arm.tokens / step_s / best[1] if best else None,
            "warmup_s": arm.warm_s,
            "samples": arm.samples,
        }
        if arm.name in shares:
            row["attention_time_share"] = shares[arm.name]
            row["attention_flops_share"] = arm.attention_flops_share
        if arm.compiled:
            row["compile_s"] = max(0.0, arm.warm_s - s["warm"] * step_s)
        rows.append(row)
    _speedups(rows, arms, rounds)
    setup = {
        "models": {k: v[0] for k, v in s["models"].items()},
        "rounds": s["rounds"],
        "rounds_used": rounds,
        "probe_n": probe.sizes,  # per dtype: the size asked for, or the one an emulated dtype was cut down to
    }
    foreign = median(x["foreign"] for a in arms for x in a.samples)
    return {
        "setup": setup,
        "peaks": peaks,
        "best_peak_dtype": best[0] if best else None,
        "rows": rows,
        "target_mfu_bf16": 0.5,
        "foreign_cpu": foreign,
    }


def best_peak(peaks: dict) -> tuple[str, float] | None:
    """(dtype, median FLOP/s) of the dtype whose matmul peak was highest: the machine's own best, which every arm's
    "MFU vs best peak" is measured against. bf16 on a GPU or a CPU with native bf16 (AMX, AVX512-BF16); fp32 on one
    without, where bf16 is emulated ~10x slower and an fp32 arm over the bf16 peak would read several hundred %."""
    medians = {k.removesuffix("_peak_flops_median"): v for k, v in peaks.items() if k.endswith("_peak_flops_median")}
    return max(medians.items(), key=lambda kv: kv[1]) if medians else None


def _speedups(rows: list[dict], arms: list[Arm], rounds: list[int]) -> None:
    """Per round, side by side: compile vs eager (same dtype) and bf16 vs fp32 (same mode); medians of ratios."""
    by = {(a.model_name, a.dtype, a.compiled, a.impl): a for a in arms}
    for row, arm in zip(rows, arms):
        eager = by.get((arm.model_name, arm.dtype, False, None))
        fp32 = by.get((arm.model_name, "fp32", arm.compiled, arm.impl))
        if arm.compiled and eager:
            row["speedup_vs_eager"] = median(eager.samples[r]["step_s"] / arm.samples[r]["step_s"] for r in rounds)
        if arm.dtype == "bf16" and fp32:
            row["speedup_vs_fp32"] = median(fp32.samples[r]["step_s"] / arm.samples[r]["step_s"] for r in rounds)


def _probe_sizes(sizes: dict | int) -> str:
    """'bf16 512³, fp32 2048³ matmuls' (a run before the sizes were kept per dtype: one size for both)."""
    if isinstance(sizes, int):
        return f"{sizes}³ matmuls"
    return ", ".join(f"{dtype} {n}³" for dtype, n in sorted(sizes.items())) + " matmuls"


def markdown(res: dict) -> str:
    p = res["peaks"]
    lines = [
        f"Matmul peak measured in this run ({_probe_sizes(res['setup']['probe_n'])} next to every timed chunk): "
        f"bf16 median {_t(p.get('bf16_peak_flops_median'))} (best {_t(p.get('bf16_peak_flops_max'))}), "
        f"fp32 median {_t(p.get('fp32_peak_flops_median'))} (best {_t(p.get('fp32_peak_flops_max'))}) TFLOP/s. "
        "MFU = useful training FLOP/s over the peak of the arm's dtype probed right before and after its steps; "
        f"MFU vs best peak: over the median peak of the faster dtype ({res.get('best_peak_dtype') or 'n/a'} here), "
        "what the machine offers whichever dtype an arm runs in.",
        "",
        "| arm | params | tokens/step | step ms | tokens/s | MFU (own dtype) | MFU vs best peak | vs eager | "
        "bf16 vs fp32 | compile s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['arm']} | {r['params'] / 1e6:.2f}M | {r['tokens_per_step']} | {r['step_ms']:.1f} | "
            f"{r['tokens_per_s']:,.0f} | {_pc(r['mfu'])} | {_pc(r['mfu_vs_best_peak'])} | "
            f"{_x(r.get('speedup_vs_eager'))} | {_x(r.get('speedup_vs_fp32'))} | "
            f"{_n(r.get('compile_s'), '.1f')} |"
        )
    lines.append("")
    lines.append("Models: " + "; ".join(f"`{k}` = `{' '.join(v)}`" for k, v in res["setup"]["models"].items()) + ".")
    return "\n".join(lines)


def best_gpt2s_mfu(res: dict) -> dict | None:
    """The gpt2s bf16 arm with the highest MFU (what the 50 % target is judged on)."""
    rows = [r for r in res["rows"] if r["model"] == "gpt2s" and r["dtype"] == "bf16" and r["mfu"]]
    return max(rows, key=lambda r: r["mfu"], default=None)


def _t(v):
    return "n/a" if v is None else f"{v / 1e12:.3f}"


def _pc(v):
    return "n/a" if v is None else f"{100 * v:.1f} %"


def _x(v):
    return "" if v is None else f"{v:.2f}×"


def _n(v, spec):
    return "" if v is None else format(v, spec)
