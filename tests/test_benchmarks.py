"""The benchmark package: `python -m benchmarks --quick` writes every section (never checks a target is reached)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
import yaml

from benchmarks.ablation import CLAIMS, SWEEP
from benchmarks.common import PeakProbe
from benchmarks.overhead import summarise
from benchmarks.report import TITLES
from benchmarks.throughput import best_peak
from benchmarks.throughput import markdown as throughput_markdown
from helpers.cli import run_cli
from helpers.peaks import seeded_bench_work

REPO = Path(__file__).resolve().parents[1]


def positive(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    work = seeded_bench_work(tmp_path_factory.mktemp("bench-work"), tmp_path_factory)
    # env: this process's as it is (not cli_env's OMP_NUM_THREADS=1 default), as a user runs a benchmark
    args = ("--quick", "--out", str(out), "--work", str(work))
    proc = run_cli("benchmarks", *args, cwd=REPO, env=dict(os.environ), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "benchmarks.json").read_text()), (out / "BENCHMARKS.md").read_text()


def test_the_peak_probe_fits_its_matmul_once_per_dtype_and_says_at_what_size(monkeypatch):
    """A bf16 matmul emulated on a CPU without native bf16 is cut down (peak.fitting_size); the fit times matmuls of
    its own (~1 s there), so it runs once per dtype, and the report names the size each dtype was measured at."""
    from gptlab.runtime import peak

    fits, timed = [], []
    monkeypatch.setattr(peak, "fitting_size", lambda dtype, device, n, call_s: fits.append(dtype) or n // 4)
    monkeypatch.setattr(peak, "_best_time", lambda fn, device, repeats, budget_s: timed.append(fn) or 0.01)
    probe = PeakProbe(512)
    flops = [probe(dt) for dt in ("bf16", "fp32", "bf16", "fp32")]
    assert fits == [torch.bfloat16, torch.float32] and len(timed) == 4
    assert probe.sizes == {"bf16": 128, "fp32": 128} and flops == [2 * 128**3 / 0.01] * 4
    res = {"setup": {"probe_n": {"fp32": 2048, "bf16": 512}, "models": {}}, "peaks": {}, "rows": []}
    assert "(bf16 512³, fp32 2048³ matmuls next to every timed chunk)" in throughput_markdown(res)
    res["setup"]["probe_n"] = 1024  # a benchmarks.json written before the sizes were kept per dtype
    assert "(1024³ matmuls next to every timed chunk)" in throughput_markdown(res)


def test_mfu_vs_best_peak_is_over_the_faster_dtypes_peak():
    """Each arm's second MFU is over the machine's best matmul peak. On a CPU without native bf16 (this AVX2 EPYC:
    F.linear at ~16 GFLOP/s in bf16, ~140 in fp32) that is fp32's; over the bf16 peak the fp32 arms read ~300 %."""
    cpu = {"bf16_peak_flops_median": 16e9, "bf16_peak_flops_max": 17e9, "fp32_peak_flops_median": 140e9}
    assert best_peak(cpu) == ("fp32", 140e9)
    assert best_peak({"bf16_peak_flops_median": 9e14, "fp32_peak_flops_median": 4e14}) == ("bf16", 9e14)
    assert best_peak({}) is None
    res = {"setup": {"probe_n": 1024, "models": {}}, "peaks": cpu, "best_peak_dtype": "fp32", "rows": []}
    assert "MFU vs best peak: over the median peak of the faster dtype (fp32 here)" in throughput_markdown(res)


@pytest.mark.slow
def test_quick_run_records_machine_and_every_section(quick):
    doc, _ = quick
    meta = doc["meta"]
    assert meta["quick"] is True and "--quick" in meta["command"]
    assert meta["machine"]["torch"] == torch.__version__ and meta["machine"]["cpu"]
    assert positive(meta["machine"]["cores"], meta["machine"]["ram_bytes"], meta["wall_s"])
    assert set(doc["sections"]) == set(TITLES)


@pytest.mark.slow
def test_quick_run_overhead_and_throughput_figures(quick):
    doc, _ = quick
    f = doc["sections"]["overhead"]["figures"]
    assert positive(f["platform_step_ms"], f["bare_step_ms"], f["platform_loop_step_ms"])
    assert math.isfinite(f["overhead_no_eval_pct"]) and math.isfinite(f["overhead_with_eval_pct"])
    tp = doc["sections"]["throughput"]
    assert positive(tp["peaks"]["bf16_peak_flops_median"], tp["peaks"]["fp32_peak_flops_median"])
    assert set(tp["setup"]["probe_n"]) == {"bf16", "fp32"}  # each dtype's size: 1024, or cut down by the fit
    assert all(512 <= n <= 1024 for n in tp["setup"]["probe_n"].values())
    arms = {(r["model"], r["dtype"], r["compile"]) for r in tp["rows"]}
    assert arms >= {("gpt2s", "bf16", True), ("gpt2s", "bf16", False), ("tiny", "fp32", False)}
    for row in tp["rows"]:
        assert positive(row["step_ms"], row["tokens_per_s"], row["mfu"], row["flops_per_token"]), row["arm"]
        assert row["tokens_per_s"] == pytest.approx(1000 * row["tokens_per_step"] / row["step_ms"])
        assert ("compile_s" in row) == row["compile"]
    best = max(tp["peaks"]["bf16_peak_flops_median"], tp["peaks"]["fp32_peak_flops_median"])
    assert tp["peaks"][f"{tp['best_peak_dtype']}_peak_flops_median"] == best
    for row in tp["rows"]:  # useful FLOP/s over the faster dtype's peak, whatever the arm's dtype
        assert row["mfu_vs_best_peak"] == pytest.approx(row["tokens_per_s"] * row["flops_per_token"] / best)


@pytest.mark.slow
def test_quick_run_ablation_goes_through_sweep_and_compare_with_claims(quick):
    doc, _ = quick
    rows = {r["arm"]: r for r in doc["sections"]["ablation"]["rows"]}
    assert list(rows) == list(yaml.safe_load(SWEEP.read_text())["arms"])
    assert rows["baseline"]["speedup"] == pytest.approx(1.0)
    for arm, row in rows.items():
        assert positive(row["tokens_per_s"], row["step_ms"], row["peak_mem_bytes"], row["speedup"]), arm
        assert row["claimed_speedup"] == (CLAIMS[arm][2] if arm in CLAIMS else None)  # gptlab-compare --claims


@pytest.mark.slow
def test_quick_run_quality_startup_and_scaling(quick):
    doc, _ = quick
    sweeps = doc["sections"]["quality"]["sweeps"]
    assert {r["arm"] for r in sweeps["fast"]["rows"]} == {"baseline", "fast"}
    assert {r["arm"] for r in sweeps["attention"]["rows"]} == {"mha", "gqa4", "gqa2", "mqa"}
    for sw in sweeps.values():
        for row in sw["rows"]:
            assert positive(row["val_loss_mean"]) and row["n_seeds"] == 2 and isinstance(row["significant"], bool)
            assert (row["delta_val_loss"] == 0) == (row["arm"] == sw["baseline"])
    st = doc["sections"]["startup"]
    for row in st["first_step"]:
        assert positive(row["first_step_s"], row["total_s"]) and row["first_step_s"] <= row["total_s"], row["case"]
    assert positive(*st["imports_s"].values())
    assert [s["runs"] for s in st["sweeps"]] == [3] and math.isfinite(st["sweeps"][0]["per_run_overhead_s"])
    sc = doc["sections"]["scaling"]
    assert {(p["impl"], p["seq"]) for p in sc["by_seq"]} == {(i, t) for i in ("naive", "sdpa") for t in (32, 64)}
    for p in sc["by_seq"] + sc["by_batch"]:
        assert positive(p["tokens_per_s"], p["step_ms"], p["peak_mem_bytes"]) and p["train_mem_bytes"] >= 0


@pytest.mark.slow
def test_quick_run_markdown_has_each_section_table(quick):
    _, md = quick
    assert md.startswith("# Benchmarks") and f"| torch | {torch.__version__}" in md
    for title in TITLES.values():
        assert f"## {title}" in md
    for header in (
        "| | gptlab-train | bare loop | overhead (median of per-round ratios) |",
        "| arm | params | tokens/step |",
        "| arm | what differs from the baseline |",
        "| sweep | arm | vs baseline |",
        "| `gptlab-train model=tiny model.n_layer=1` |",  # the quick run's first steps: one block
        "| seq | naive tokens/s |",
        "| batch | naive tokens/s |",
        "| side | wall ms / step | minimal GPT's ms / this side's |",
    ):
        assert header in md


def test_bad_arguments_fail_in_one_line_and_write_nothing(tmp_path):
    proc = run_cli(
        "benchmarks",
        "--quick",
        "--only",
        "overhead,nosuch",
        "--out",
        str(tmp_path / "out"),
        cwd=REPO,
        env=dict(os.environ),
        timeout=900,
    )
    assert proc.returncode == 2 and not (tmp_path / "out").exists()
    assert proc.stderr.strip().splitlines() == [
        "error: --only: unknown section 'nosuch'; allowed: overhead, throughput, ablation, quality, startup, scaling, minimal_gpt"
    ]
    target = tmp_path / "file"
    target.write_text("keep")
    proc = run_cli("benchmarks", "--quick", "--out", str(target), cwd=REPO, env=dict(os.environ), timeout=900)
    assert proc.returncode == 2 and target.read_text() == "keep"
    assert "--out" in proc.stderr and "not a directory" in proc.stderr


@pytest.mark.slow
def test_compiled_model_trains_through_the_loop(tmp_path):
    """hardware.compile=true (what section 2 measures) runs in gptlab-train and matches eager losses."""
    from helpers.train import rows, run_inprocess

    eager = run_inprocess(tmp_path / "eager", steps=2, eval_interval=2)
    compiled = run_inprocess(tmp_path / "compiled", "hardware.compile=true", steps=2, eval_interval=2)
    assert compiled["status"] == eager["status"] == "finished"
    losses = [[r["train/loss"] for r in rows(tmp_path / d) if "train/loss" in r] for d in ("eager", "compiled")]
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)


def test_overhead_splits_intervals_with_and_without_eval():
    # steps 10..60 logged every 10; evals at 0, 20, 40; clean steps take 5 ms, each eval adds 30 ms
    wall, rows = 0.0, []
    for step in range(10, 70, 10):
        rows.append({"step": step, "wall_s": wall})
        wall += (10 * 5 + (30 if step % 20 == 0 else 0)) / 1000
    res = summarise(rows, log=10, eval_every=20)
    assert res["step_ms"] == pytest.approx(5.0) and res["eval_ms"] == pytest.approx(30.0)


def test_regenerating_keeps_the_hand_written_sections():
    """`python -m benchmarks` rewrites its own sections and keeps every other one (studies, other scripts' tables)."""
    from benchmarks import report

    made = next(iter(report.TITLES.values()))
    old = f"# Benchmarks\n\nheader\n\n## {made}\n\nold figures\n\n## Associative recall\n\nhand table\n"
    kept = report.kept_sections(old)
    assert "## Associative recall\n\nhand table" in kept and "old figures" not in kept
    other = next(name for name, title in report.TITLES.items() if title != made)
    kept = report.kept_sections(old, {other})  # `--only other`: the section it did not run stays
    assert f"## {made}\n\nold figures" in kept and "## Associative recall" in kept


def test_a_partial_run_keeps_the_other_sections_figures_and_the_pages_header(tmp_path):
    """`--only X` replaces X's figures and says when and by what X was measured; the other sections' raw figures, the
    full run's meta and the page header stay: no section is shown under another run's date or commit."""
    import json

    from benchmarks import report

    full = {"command": "python -m benchmarks", "date": "2026-01-01 00:00 UTC", "machine": {"git_commit": "aaa"}}
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps({"meta": full, "sections": {"overhead": {"figures": 1}}}))
    part = {"command": "python -m benchmarks --only minimal_gpt", "date": "2026-02-02 00:00 UTC"}
    part["machine"] = {"git_commit": "bbb", "git_dirty": True, "cpu": "X", "bf16": "native"}
    doc = report.merged(path, part, {"minimal_gpt": {"figures": 2}}, partial=True)
    assert doc["meta"] == full and doc["sections"] == {"overhead": {"figures": 1}, "minimal_gpt": {"figures": 2}}
    assert doc["section_meta"] == {"minimal_gpt": part}
    assert report.merged(path, part, {"minimal_gpt": {}}, partial=False)["meta"] == part  # a full run replaces all
    line = report._provenance(part)
    assert line.startswith("*Measured separately by `python -m benchmarks --only minimal_gpt` on 2026-02-02")
    assert "gptlab bbb + local changes; X, bf16 native" in line


def test_the_minimal_gpt_is_gptlabs_architecture():
    """benchmarks/minimal_gpt.py's MinimalGPT, given gptlab's weights for the benchmark's config, computes the same
    fp32 loss: the side-by-side compares the same model, not a smaller one."""
    from benchmarks import minimal_gpt
    from benchmarks.common import build_platform

    s = dict(layers=2, d=32, heads=2, T=16, B=2)
    built = build_platform([*minimal_gpt.overrides(s), "hardware.dtype=fp32"])
    ours, vocab = built["model"], built["data"].vocab_size
    mini = minimal_gpt.MinimalGPT(vocab, s["d"], s["heads"], s["layers"], s["T"])
    names = {
        "position.wpe.": "wpe.",
        "norm1": "ln1",
        "norm2": "ln2",
        "mlp.up": "fc",
        "mlp.down": "out",
        "norm_f": "ln_f",
    }
    state = {}
    for name, tensor in ours.state_dict().items():
        for a, b in names.items():
            name = name.replace(a, b)
        state[name.replace("lm_head", "head")] = tensor
    missing, unexpected = mini.load_state_dict(state, strict=False)
    assert set(missing) <= {"head.weight"} and not unexpected  # head.weight is wte.weight (tied)
    assert sum(p.numel() for p in mini.parameters()) == ours.num_params()
    x, y = built["data"].train_samples(0, s["B"])
    assert mini(x, y).item() == pytest.approx(ours(x, y)[1].item(), rel=1e-5)


def test_the_pages_paragraphs_are_wrapped_and_its_tables_and_headings_kept():
    """BENCHMARKS.md's readings are refilled to PROSE_WIDTH (docs' prose lines stay under 300 characters), word for
    word; a table row, however long, and a heading stay as written."""
    from benchmarks import report

    paragraph = " ".join(f"word{i}" for i in range(150))
    table = "| a | b |\n|---|---|\n| " + "x" * 400 + " | y |"
    title, wrapped, kept = report._wrapped(f"## Title\n\n{paragraph}\n\n{table}").split("\n\n")
    assert title == "## Title" and kept == table
    assert max(map(len, wrapped.splitlines())) <= report.PROSE_WIDTH and wrapped.split() == paragraph.split()
