"""`python -m benchmarks.data_scale` (issue 16): runs on a tiny corpus and writes sane figures (not a measurement)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from helpers.cli import run_cli

REPO = Path(__file__).resolve().parents[1]


def data_scale(tmp_path: Path, *args: str) -> dict:
    # env: this process's as it is (not cli_env's OMP_NUM_THREADS=1 default), as a user runs a benchmark
    proc = run_cli(
        "benchmarks.data_scale",
        "--sizes",
        "2MB",
        "--num-proc",
        "2",
        "--wait",
        "0",
        "--work",
        str(tmp_path / "work"),
        "--out",
        str(tmp_path / "out"),
        *args,
        cwd=REPO,
        timeout=600,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| corpus | num_proc | full hash s | tokenize s | MB/s |" in proc.stdout
    return json.loads((tmp_path / "out" / "data_scale.json").read_text())


def positive(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
def test_tokenize_figures_for_both_formats(tmp_path):
    doc = data_scale(tmp_path, "--no-train")
    assert set(doc) >= {"meta", "corpora", "tokenize", "train", "extrapolation_10GB", "issue_before", "foreign_cpu"}
    corpus = doc["corpora"][0]
    assert corpus["txt_bytes"] >= 2_000_000 and corpus["jsonl_docs"] > 100  # ~4 KB documents
    rows = {r["format"]: r for r in doc["tokenize"]}
    assert set(rows) == {"txt", "jsonl"} and doc["train"] == []
    for r in rows.values():
        assert positive(r["tokens"], r["mb_per_s"], r["peak_rss_mib"], r["tokenize_s"], r["cache_bytes"]), r
        assert not r["from_cache"] and r["leftovers"] == [] and r["progress_lines"] >= 1 and r["cpus"] >= 1
        assert r["peak_rss_mib"] >= r["rss_after_imports_mib"] and 0 <= r["foreign"] <= 1
    assert abs(rows["txt"]["tokens"] - rows["jsonl"]["tokens"]) <= 1  # the same text: one end-of-text vs one each doc
    for e in doc["extrapolation_10GB"]:  # linear in size, peak RSS as measured
        r = next(r for r in doc["tokenize"] if r["corpus"] == e["from"] and r["num_proc"] == e["num_proc"])
        assert e["tokens"] == pytest.approx(r["tokens"] * 1e10 / r["text_bytes"])
        assert e["peak_rss_mib"] == r["peak_rss_mib"]


@pytest.mark.slow
def test_first_step_and_data_share_on_the_cached_corpus(tmp_path):
    doc = data_scale(tmp_path, "--repeats", "1", "--steps", "7")
    (train,) = doc["train"]
    assert train["cache_hit"] and train["data_ready"]["from_cache"] and positive(train["data_ready_s"])
    assert positive(train["first_step_s"], train["setup_s"], train["loop_s"], train["total_s"])
    assert train["first_step_s"] <= train["total_s"]
    assert [s["prefetch"] for s in train["data_share"]] == [2, 0]
    for s in train["data_share"]:
        assert s["in_summary"] and positive(s["step_ms_median"]) and 0 <= s["data_share"] < 1
