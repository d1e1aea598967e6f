"""docs/BENCHMARKS.md from the raw figures: machine header, one table and a short reading per section."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from benchmarks import ablation, minimal_gpt, overhead, quality, scaling, startup, throughput

TITLES = {
    "overhead": "1. Platform overhead",
    "throughput": "2. Throughput and MFU per dtype",
    "ablation": "3. The seeds' ablation table, measured",
    "quality": "4. Equal-step quality",
    "startup": "5. Startup",
    "scaling": "6. Scaling with sequence length and batch size",
    "minimal_gpt": "7. gptlab-train vs a minimal GPT",
}
TABLES = {
    "overhead": overhead.markdown,
    "throughput": throughput.markdown,
    "ablation": ablation.markdown,
    "quality": quality.markdown,
    "startup": startup.markdown,
    "scaling": scaling.markdown,
    "minimal_gpt": minimal_gpt.markdown,
}


PROSE_WIDTH = 120  # the page's paragraphs are wrapped (tests/test_docs.py refuses a prose line over 300 characters)


def _wrapped(part: str) -> str:
    """`part` with each one-line paragraph refilled to PROSE_WIDTH; tables, headings and multi-line blocks as they are."""
    return "\n\n".join(
        block
        if "\n" in block or block.startswith(("|", "#"))
        else textwrap.fill(block, PROSE_WIDTH, break_long_words=False, break_on_hyphens=False)
        for block in part.split("\n\n")
    )


# This page is the CPU's; the GPU's figures (`make gpu-study`) live on their own pages.
GPU_POINTER = (
    "GPU figures (the d12 table, gptlab-train vs the minimal GPT, MFU, host syncs, CUDA graphs; `make gpu-study`) "
    "are in [GPU.md](GPU.md) and [STUDIES.md](STUDIES.md#the-d12-study-on-a-gpu-window-sized-measured-2026-11-27-one-h200); "
    "this page is the CPU's."
)


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def read_overhead(res: dict) -> str:
    f, target = res["figures"], res["target_pct"]
    spread = [
        100 * (r["platform"]["step_ms"] / r["bare"]["step_ms"] - 1)
        for r in res["rounds"]
        if r["platform"]["step_ms"] and r["bare"]["step_ms"]
    ]
    text = (
        f"Without eval, gptlab-train's wall time per step is {f['overhead_no_eval_pct']:+.1f} % vs the bare loop "
        f"(target ≤ {target:.0f} %: {_met(f['overhead_no_eval_pct'] <= target)})"
    )
    text += (
        f"; single rounds ranged {min(spread):+.1f} … {max(spread):+.1f} %, the noise of this machine. "
        if len(spread) > 1
        else ". "
    )
    if f["platform_loop_step_ms"] and f["platform_step_ms"]:
        outside = f["platform_step_ms"] - f["platform_loop_step_ms"]
        text += (
            f"Of the platform's {f['platform_step_ms']:.1f} ms, about {max(0.0, outside):.1f} ms lie outside the "
            "timed step (LR update, batch slicing, metrics rows, W&B and progress). "
        )
    text += (
        f"With the default eval cadence the difference is {f['overhead_with_eval_pct']:+.1f} %; the eval "
        "batches themselves are work a bare loop evaluating the same batches pays as well."
    )
    return text


def read_throughput(res: dict) -> str:
    best = throughput.best_gpt2s_mfu(res)
    rows = {r["arm"]: r for r in res["rows"]}
    if best is None:
        return "No GPT-2-small-shaped bf16 arm was measured."
    eager, compiled = rows.get("gpt2s bf16 eager"), rows.get("gpt2s bf16 compile")
    text = (
        f"Best GPT-2-small-shaped bf16 arm: `{best['arm']}` at {100 * best['mfu']:.1f} % of the bf16 matmul peak "
        f"measured next to it (target ≥ 50 %: {_met(best['mfu'] >= res['target_mfu_bf16'])})"
    )
    text += f"; eager bf16 reaches {100 * eager['mfu']:.1f} %. " if eager and eager is not best else ". "
    if compiled and compiled.get("speedup_vs_eager"):
        text += (
            f"torch.compile makes the gpt2s bf16 step {compiled['speedup_vs_eager']:.2f}× faster than eager (it "
            f"fuses the norms, RoPE, GELU and casts) after {compiled['compile_s']:.0f} s of compilation. "
        )
    timed = [r for r in (compiled, eager) if r and r.get("attention_time_share") is not None]
    if timed:
        r = timed[0]
        text += (
            f"Attention kernels take {100 * r['attention_time_share']:.0f} % of the `{r['arm']}` step's CPU time "
            f"(torch.profiler) for ≈{100 * r['attention_flops_share']:.0f} % of its FLOPs: torch's CPU "
            "flash-attention kernel runs far below the matmul rate, and that is the largest part of the gap to "
            "the peak. "
        )
    naive = rows.get("gpt2s bf16 compile naive")
    if naive and compiled:
        text += (
            f"Compiled, the materialised attention (`attention.impl=naive hardware.compile=true`) runs "
            f"{compiled['step_ms'] / naive['step_ms']:.2f}× as fast as compiled sdpa, at "
            f"{100 * naive['mfu']:.1f} % "
            "MFU: Inductor fuses its mask and softmax and leaves the T×T products to the matmul kernels, which "
            "at this length beats the CPU flash kernel (at the price of T² memory, see section 6). "
        )
    return text + (
        "`model=tiny` (d_model 128) cannot get near the peak: its matmuls are small and the step is "
        "dominated by memory-bound element-wise work and per-op overhead."
    )


def read_ablation(res: dict) -> str:
    claimed = [r for r in res["rows"] if r["claimed_speedup"]]
    near = [r["arm"] for r in claimed if abs(r["speedup"] / r["claimed_speedup"] - 1) <= 0.1]
    rows = {r["arm"]: r for r in res["rows"]}
    text = (
        f"{len(near)} of {len(claimed)} claimed speed-ups are reproduced within ±10 % of the claim's midpoint"
        f"{' (' + ', '.join(near) + ')' if near else ''}. The seeds' figures are GPU figures for GPT-2 d12 at "
        "T 1024, where attention's memory traffic dominates a step. "
    )
    if "sdpa" in rows:
        gain = rows["sdpa"]["speedup"]
        text += f"Here SDPA runs at {gain:.2f}× the naive kernel" + (
            ": on this CPU torch's fused attention kernel gains little over the materialised Q·Kᵀ/softmax at this "
            "length. "
            if gain < 1.1
            else ". "
        )
    text += (
        "GQA/MQA shrink only the K/V projections in training, and the naive kernel even copies K/V back to "
        "every head, so their speed-ups stay small; the MLP ratio acts on the largest matmuls. "
        "Speed-ups are medians over interleaved rounds on a shared machine: differences under ~5 % are noise."
    )
    return text


def read_quality(res: dict) -> str:
    parts = []
    for name, sw in res["sweeps"].items():
        others = [r for r in sw["rows"] if r["arm"] != sw["baseline"]]
        sig = [r["arm"] for r in others if r["significant"]]
        parts.append(
            f"`{name}` at step {sw['step']}: "
            + (
                f"{', '.join(sig)} differ significantly from {sw['baseline']}"
                if sig
                else f"no arm differs from {sw['baseline']} beyond seed noise"
            )
        )
    return (
        "; ".join(parts) + ". A short fixed budget on a small model can only show large effects; "
        "the seeds' quality claims are for full-length GPU runs."
    )


def read_startup(res: dict) -> str:
    rows = {r["case"]: r for r in res["first_step"]}
    default, bare = rows.get("warm cache, default (W&B offline)"), rows.get("warm cache, logger=none")
    imports = res["imports_s"]
    heavy = sorted(((v, k) for k, v in imports.items() if v), reverse=True)[:3]
    text = (
        f"With a warm cache, `gptlab-train model=tiny` reaches its first optimizer step in "
        f"{default['first_step_s']:.2f} s with W&B offline (target ≤ {res['target_s']:.0f} s: "
        f"{_met(default['first_step_s'] <= res['target_s'])}) and {bare['first_step_s']:.2f} s with logger=none. "
        f"The largest imports: {', '.join(f'{k} {v:.2f} s' for v, k in heavy)}; W&B's own start (wandb.init "
        "launches its service process) comes on top when it is the logger. "
    )
    compiled = rows.get("warm cache, logger=none hardware.compile=true")
    if compiled:
        text += (
            f"With hardware.compile=true (empty Inductor cache) the first step comes after "
            f"{compiled['first_step_s']:.1f} s: compilation happens inside the first forward and backward. "
        )
    for s in res["sweeps"]:
        how = s.get("label", f"the {s['launcher']} launcher")
        text += f"A sweep through the {how} costs {s['per_run_overhead_s']:.1f} s per run beyond training. "
    return text


def read_scaling(res: dict) -> str:
    seq = res["by_seq"]
    lo, hi = min(p["seq"] for p in seq), max(p["seq"] for p in seq)
    mem = {(p["impl"], p["seq"]): max(1, p["train_mem_bytes"]) for p in seq}
    speed = {(p["impl"], p["seq"]): p["tokens_per_s"] for p in seq}
    growth = {i: mem[(i, hi)] / mem[(i, lo)] for i in scaling.IMPLS}
    text = (
        f"From T {lo} to {hi} ({hi // lo}× longer, same batch) training memory grows {growth['naive']:.1f}× with "
        f"the naive kernel and {growth['sdpa']:.1f}× with sdpa; at T {hi} naive needs "
        f"{mem[('naive', hi)] / mem[('sdpa', hi)]:.1f}× sdpa's memory and runs at "
        f"{speed[('naive', hi)] / speed[('sdpa', hi)]:.2f}× its speed. "
    )
    if growth["naive"] > 1.5 * growth["sdpa"]:
        text += (
            "That is the O(T²) term: naive materialises the B·H·T×T scores and probabilities "
            "(softmax in fp32) "
            "and keeps them for backward, while sdpa works on blocks and keeps only O(T) statistics. "
        )
    else:
        text += "At these lengths the T×T tensors are still too small to dominate memory. "
    return text + "Across batch sizes both kernels' memory grows linearly, as expected."


READINGS = {
    "overhead": read_overhead,
    "throughput": read_throughput,
    "ablation": read_ablation,
    "quality": read_quality,
    "startup": read_startup,
    "scaling": read_scaling,
    "minimal_gpt": minimal_gpt.reading,
}


def header(meta: dict) -> str:
    m = meta["machine"]
    ram = f"{m['ram_bytes'] / 2**30:.0f} GiB" if m.get("ram_bytes") else "unknown"
    return "\n".join(
        [
            "# Benchmarks",
            "",
            f"Measured by `{meta['command']}` on {meta['date']}"
            f"{' (**--quick**: tiny sizes, not figures to quote)' if meta['quick'] else ''}, "
            f"in {meta['wall_s'] / 60:.1f} min. Raw figures: `benchmarks.json` next to this file.",
            "",
            GPU_POINTER,
            "",
            "| machine | |",
            "|---|---|",
            f"| CPU | {m['cpu']} ({m['cores']} cores, {m['cores_usable']} usable, {m['torch_threads']} torch threads) |",
            *([f"| bf16 | {m['bf16']} |"] if m.get("bf16") else []),
            f"| RAM | {ram} |",
            f"| torch | {m['torch']} (Python {m['python']}) |",
            f"| platform | {m['platform']} |",
            f"| gptlab | {m['git_commit']}{' + local changes' if m['git_dirty'] else ''} |",
            "",
            "This machine is shared: other processes may use the same cores while figures are taken, so absolute "
            f"times drift{_probe_range(meta)}. Everything that is compared was therefore measured side by side — "
            "interleaved rounds, a matmul-peak probe next to every timed chunk — and is reported as medians and ratios; "
            "each section says how much of the cores other processes used meanwhile. Re-run `make bench` on a quiet "
            "machine for absolute figures to quote; the ratios should hold.",
        ]
    )


def _probe_range(meta: dict) -> str:
    lo, hi = meta.get("bf16_probe_min"), meta.get("bf16_probe_max")
    if not lo or not hi:
        return ""
    return f" (the bf16 matmul probes of this run ranged {lo / 1e12:.2f}–{hi / 1e12:.2f} TFLOP/s)"


def _contention(res: dict) -> str:
    share = res.get("foreign_cpu")
    if share is None:
        return ""
    return (
        f" Other processes used {100 * share:.0f} % of the cores while this section measured (median over its "
        "samples; samples taken while they used under 15 % are preferred where there are enough)."
    )


def merged(path: Path, meta: dict, results: dict, partial: bool) -> dict:
    """benchmarks.json after this run: a full run replaces it; a partial one (--only) replaces only its sections and
    records their own provenance (section_meta), keeping the other sections, their figures and the page's header
    (the full run's meta) as they were: a section is never shown under another run's date or commit."""
    doc: dict = {"meta": meta, "sections": results, "section_meta": {}}
    if partial and path.is_file():
        old = json.loads(path.read_text())
        doc = {
            "meta": old.get("meta", meta),
            "sections": {**old.get("sections", {}), **results},
            "section_meta": {**old.get("section_meta", {}), **{name: meta for name in results}},
        }
    return doc


def _provenance(meta: dict | None) -> str:
    """The line under a section measured by another run than the page's header names."""
    if not meta:
        return ""
    m = meta.get("machine", {})
    commit = f"{m.get('git_commit')}{' + local changes' if m.get('git_dirty') else ''}"
    return (
        f"*Measured separately by `{meta['command']}` on {meta['date']} (gptlab {commit}; {m.get('cpu')}, bf16 "
        f"{m.get('bf16', 'not recorded')}), not with the header's run.*"
    )


def markdown(results: dict, ran: set[str] | None = None, head: str | None = None) -> str:
    """The BENCHMARKS.md page for `ran` (default: every section in results): the header of results' meta (or `head`,
    an existing page's header kept verbatim by a partial run), then each section, with its own provenance line when
    another run than the header's measured it."""
    parts = [head.rstrip() if head is not None else header(results["meta"])]
    for name, title in TITLES.items():
        res = results["sections"].get(name)
        if res is None or (ran is not None and name not in ran):
            continue
        own = _provenance(results.get("section_meta", {}).get(name))
        parts += [
            f"## {title}",
            *([own] if own else []),
            TABLES[name](res),
            READINGS[name](res).strip() + _contention(res),
        ]
    return "\n\n".join(_wrapped(part) for part in parts) + "\n"


def kept_sections(old: str, ran: set[str] | None = None) -> str:
    """The sections of an existing BENCHMARKS.md that this run did not produce (hand-written studies, other scripts'
    figures, and the sections `--only` left out): kept after the regenerated ones, so a run never drops them."""
    made = {TITLES[name] for name in (TITLES if ran is None else ran) if name in TITLES}
    kept = [s for s in old.split("\n## ")[1:] if s.split("\n", 1)[0].strip() not in made]
    return "".join(f"\n## {s.rstrip()}\n" for s in kept)
