"""1. Platform overhead: gptlab-train's wall time per step vs a bare PyTorch loop on the same model, batch and dtype.

Both sides log the wall clock every `log` steps and evaluate the same fixed validation batches every `eval`
steps. Per-step time = wall time of a `log`-step interval / `log`, taken over intervals without an eval
("eval excluded"); an interval holding an eval gives the eval's cost, which is then amortised at the
default eval cadence ("eval included"). Rounds alternate platform and bare loop; the ratio is a median.
"""

from __future__ import annotations

import time

# isort: off
from benchmarks.common import (
    Bench,
    CpuMeter,
    bare_step,
    build_platform,
    gptlab,
    median,
    quiet,
    ratio,
    read_rows,
    run,
    wait_quiet,
)
# isort: on


def sizes(bench: Bench) -> dict:
    full = dict(rounds=5, steps=60, eval=20, log=10, wait=15, overrides=["model=tiny"])
    quick = dict(
        rounds=1, steps=30, eval=10, log=5, wait=0, overrides=["model=tiny", "model.n_layer=2", "train.batch_size=8"]
    )
    return bench.pick(full, quick)


def intervals(rows: list[dict], log: int, eval_every: int) -> list[tuple[bool, float]]:
    """(holds an eval, wall ms) of each `log`-step interval between consecutive {step, wall_s} rows, in order."""
    marks = sorted((r["step"], r["wall_s"]) for r in rows if r["step"] % log == 0 and r.get("wall_s") is not None)
    out = []
    for (a, wa), (b, wb) in zip(marks, marks[1:]):
        if b - a == log:
            has_eval = any(s % eval_every == 0 for s in range(a, b))  # the eval at step s runs before step s+1
            out.append((has_eval, 1000 * (wb - wa)))
    return out


def summarise(rows: list[dict], log: int, eval_every: int) -> dict:
    """Median ms per step over intervals without an eval; ms per eval = an eval interval minus its neighbours."""
    spans = intervals(rows, log, eval_every)
    clean = [ms / log for has_eval, ms in spans if not has_eval]
    evals = []
    for i, (has_eval, ms) in enumerate(spans):
        near = [m / log for e, m in spans[max(0, i - 1) : i + 2] if not e]  # the clean intervals next to it in time
        if has_eval and near:
            evals.append(ms - log * sum(near) / len(near))
    return {"step_ms": median(clean), "eval_ms": median(evals)}


def platform_round(bench: Bench, s: dict, out) -> dict:
    """One gptlab-train run through the real CLI (W&B offline, the default logger); its per-step wall times."""
    run_dir = out / f"run{time.monotonic_ns()}"
    args = [
        *s["overrides"],
        f"train.max_steps={s['steps']}",
        f"train.eval_interval={s['eval']}",
        f"train.log_interval={s['log']}",
        "sample.tokens=0",
        f"hydra.run.dir={run_dir}",
    ]
    run(bench, gptlab("train") + args)
    rows = [r for r in read_rows(run_dir / "metrics.jsonl") if "train/loss" in r]
    result = summarise(rows, s["log"], s["eval"])
    result["loop_step_ms"] = median(r["perf/step_ms"] for r in rows[1:])  # the loop's own perf/step_ms figure
    return result


def bare_round(s: dict, built: dict) -> dict:
    """The same steps as a plain loop: same model module, batches, dtype, clip and eval batches; no platform."""
    import torch

    model, opt, hw, data = built["model"], built["optimizer"], built["hardware"], built["data"]
    bs = built["batch_size"]
    batches = [data.train_samples(step * bs, bs) for step in range(s["steps"])]
    vx, vy = data.val_samples(int(built["cfg"].train.eval_sequences))
    val = [(vx[i : i + bs], vy[i : i + bs]) for i in range(0, len(vx), bs)]
    rows, start = [], time.perf_counter()
    for step in range(s["steps"]):
        if step % s["eval"] == 0:
            model.eval()
            with torch.no_grad(), hw.autocast():
                [model(x, y)[1].item() for x, y in val]
            model.train()
        x, y = batches[step]
        bare_step(model, model, opt, hw.autocast, x, y, built["grad_clip"])
        if (step + 1) % s["log"] == 0:
            rows.append({"step": step + 1, "wall_s": time.perf_counter() - start})
    return summarise(rows, s["log"], s["eval"])


def measure(bench: Bench) -> dict:
    s = sizes(bench)
    out = bench.dir("overhead")
    from gptlab.config.build import compose

    default_eval = int(compose([]).train.eval_interval)
    built = build_platform(s["overrides"])
    rounds = []
    for r in range(s["rounds"]):
        bench.log(f"overhead round {r + 1}/{s['rounds']}: gptlab-train, then the bare loop")
        wait_quiet(bench, s["wait"])
        with CpuMeter() as m_plat:
            plat = platform_round(bench, s, out)
        with CpuMeter() as m_bare:
            bare = bare_round(s, built)
        rounds.append({"platform": plat, "bare": bare, "foreign": max(m_plat.foreign, m_bare.foreign)})
    return _result(rounds, s, default_eval, built)


def _amortised(side: dict, every: int) -> float | None:
    if side["step_ms"] is None or side["eval_ms"] is None:
        return None
    return side["step_ms"] + max(0.0, side["eval_ms"]) / every


def _result(all_rounds: list[dict], s: dict, default_eval: int, built: dict) -> dict:
    rounds = quiet(all_rounds)
    no_eval = [ratio(r["platform"]["step_ms"], r["bare"]["step_ms"]) for r in rounds]
    with_eval = [ratio(_amortised(r["platform"], default_eval), _amortised(r["bare"], default_eval)) for r in rounds]
    cfg = built["cfg"]
    figures = {
        "platform_step_ms": median(r["platform"]["step_ms"] for r in rounds),
        "bare_step_ms": median(r["bare"]["step_ms"] for r in rounds),
        "platform_loop_step_ms": median(r["platform"]["loop_step_ms"] for r in rounds),
        "platform_eval_ms": median(r["platform"]["eval_ms"] for r in rounds),
        "bare_eval_ms": median(r["bare"]["eval_ms"] for r in rounds),
        "overhead_no_eval_pct": 100 * (median(no_eval) - 1) if median(no_eval) else None,
        "overhead_with_eval_pct": 100 * (median(with_eval) - 1) if median(with_eval) else None,
    }
    setup = {
        "overrides": s["overrides"],
        "steps": s["steps"],
        "rounds": s["rounds"],
        "log_interval": s["log"],
        "eval_interval_measured": s["eval"],
        "eval_interval_amortised": default_eval,
        "eval_sequences": int(cfg.train.eval_sequences),
        "batch_size": int(cfg.train.batch_size),
        "seq_len": int(cfg.model.block_size),
        "dtype": str(cfg.hardware.dtype),
    }
    return {
        "setup": setup,
        "figures": figures,
        "rounds": all_rounds,
        "rounds_used": len(rounds),
        "target_pct": 1.0,
        "foreign_cpu": median(r["foreign"] for r in all_rounds),
    }


def markdown(res: dict) -> str:
    f, s = res["figures"], res["setup"]
    lines = [
        f"`gptlab-train {' '.join(s['overrides'])}` (batch {s['batch_size']}, T {s['seq_len']}, {s['dtype']}, "
        f"W&B offline, log every {s['log_interval']} steps) vs a bare loop (autocast forward, backward, clip, "
        f"fused AdamW, zero grads) on the same module and batches; {s['steps']} steps × {s['rounds']} interleaved "
        f"round{'s' if s['rounds'] > 1 else ''}, medians.",
        "",
        "| | gptlab-train | bare loop | overhead (median of per-round ratios) |",
        "|---|---|---|---|",
        f"| wall ms / step, eval excluded | {_f(f['platform_step_ms'])} | {_f(f['bare_step_ms'])} | "
        f"{_pct(f['overhead_no_eval_pct'])} |",
        f"| ms per eval ({s['eval_sequences']} sequences) | {_f(f['platform_eval_ms'])} | {_f(f['bare_eval_ms'])} | |",
        f"| wall ms / step, eval every {s['eval_interval_amortised']} steps included | "
        f"{_f(_incl(f['platform_step_ms'], f['platform_eval_ms'], s))} | "
        f"{_f(_incl(f['bare_step_ms'], f['bare_eval_ms'], s))} | "
        f"{_pct(f['overhead_with_eval_pct'])} |",
        f"| the loop's own `step_ms` (metrics.jsonl) | {_f(f['platform_loop_step_ms'])} | | |",
    ]
    return "\n".join(lines)


def _incl(step, ev, s):
    return None if step is None or ev is None else step + max(0.0, ev) / s["eval_interval_amortised"]


def _f(v, spec=".1f"):
    return "n/a" if v is None else format(v, spec)


def _pct(v):
    return "n/a" if v is None else f"{v:+.1f} %"
