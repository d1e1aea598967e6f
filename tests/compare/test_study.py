"""Several sweep dirs are one study only when they were run alike: budget, schedule, eval grid, code version and
machine (validation sets are checked run by run). Otherwise compare splits them into one table per study, each with a
note saying why (never one table with verdicts across budgets), or, under --split-by, refuses in one line; a
--baseline that matches several groups is refused naming them; --lr-grid over mixed dirs names the runs it left out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gptlab.cli.compare import main
from gptlab.compare import modes
from gptlab.compare.reading.like import value
from gptlab.compare.reading.runs import load_run
from gptlab.compare.reading.study import split_study
from gptlab.compare.render import words
from gptlab.errors import ConfigError
from helpers.compare import write_run


def _curve(level: float, seed: int):
    return lambda step: level + 2.0 * (0.97**step) + 0.003 * seed


def sweep(root: Path, arms: dict[str, tuple[dict, float]], steps: int = 100, seeds=(0, 1, 2), lrs=None, **kw) -> Path:
    """A gptlab-sweep dir: sweep.yaml and <arm>/seed<k> (or <arm>/lr<v>/seed<k>) runs that record sweep and arm."""
    root.mkdir(parents=True)
    extra = kw.pop("x", {})
    record = {"arms": {a: [] for a in arms}, "seeds": list(seeds), **({"lr_grid": lrs} if lrs else {})}
    (root / "sweep.yaml").write_text(yaml.safe_dump(record, sort_keys=False))
    for arm, (choices, level) in arms.items():
        for lr in lrs or [None]:
            for seed in seeds:
                where = root / arm / (f"lr{lr:g}" if lr else "") / f"seed{seed}"
                leaves = {"sweep": root.name, "arm": arm, **({"optimizer.lr": lr} if lr else {}), **extra}
                write_run(
                    where, seed=seed, choices=choices, leaves=leaves, max_steps=steps, loss_at=_curve(level, seed), **kw
                )
    return root


MHA, GQA4, GQA2 = ({}, 1.50), ({"attention": "gqa"}, 1.52), ({"attention": "gqa"}, 1.55)


def _three(tmp: Path) -> list[Path]:
    """The issue's example: attn (mha, gqa4, gqa2; 100 steps), mqa_match (mha, mqa; 100 steps) and attn_lr (an lr grid
    of mha and gqa4 at 150 steps)."""
    attn = sweep(tmp / "attn", {"mha": MHA, "gqa4": GQA4, "gqa2": GQA2})
    for seed in range(3):  # gqa2 differs from gqa4 in attention.n_kv_head
        cfg = attn / "gqa2" / f"seed{seed}" / ".hydra" / "config.yaml"
        doc = yaml.safe_load(cfg.read_text())
        doc["attention"]["n_kv_head"] = 3
        cfg.write_text(yaml.safe_dump(doc))
    match = sweep(tmp / "mqa_match", {"mha": MHA, "mqa": ({"attention": "mqa"}, 1.56)})
    grid = sweep(tmp / "attn_lr", {"mha": MHA, "gqa4": GQA4}, steps=150, seeds=(0, 1), lrs=[1e-3, 3e-3])
    return [attn, match, grid]


def test_sweeps_of_different_budgets_are_split_never_one_table(tmp_path, capsys):
    """Before: one 12-row table read at step 100 across 100- and 150-step budgets. Now: one table per budget, each
    saying why; the 150-step lr grid's several mha groups refuse an ambiguous --baseline in one line."""
    dirs = _three(tmp_path)
    runs = [load_run(p) for d in dirs for p in sorted(d.glob("**/seed*"))]
    parts, keys, why = split_study(runs)
    assert keys == ["train.max_steps"] and [p.title for p in parts] == ["train.max_steps=100", "train.max_steps=150"]
    assert {value(r, "train.max_steps") for r in parts[0].runs} == {"100"} and len(parts[1].runs) == 8
    assert why is not None and why.is_warning
    assert "train.max_steps: 100 in attn, mqa_match; 150 in attn_lr" in why.text
    out = tmp_path / "out"
    rc = main([*map(str, dirs), "--baseline", "attention=mha", "--out", str(out), "--no-wandb"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("gptlab-compare: error: [train.max_steps=150] --baseline 'attention=mha' matches 2 groups")
    assert "optimizer.lr=0.001; optimizer.lr=0.003" in err and not out.exists()


def test_split_parts_are_written_as_split_by_writes_them(tmp_path, capsys):
    a = sweep(tmp_path / "short", {"mha": MHA, "mqa": ({"attention": "mqa"}, 1.56)})
    b = sweep(tmp_path / "long", {"mha": MHA, "gqa": GQA4}, steps=150)
    out = tmp_path / "out"
    assert main([str(a), str(b), "--baseline", "attention=mha", "--out", str(out), "--no-wandb"]) == 0
    captured = capsys.readouterr()
    index = json.loads((out / "comparison.json").read_text())
    assert index["split_by"] == ["train.max_steps"]
    assert [p["out"] for p in index["parts"]] == ["train.max_steps=100", "train.max_steps=150"]
    short = json.loads((out / "train.max_steps=100" / "comparison.json").read_text())
    assert len(short["rows"]) == 2 and any("not one study" in w for w in short["warnings"])
    assert "the 2 tables split by train.max_steps" in captured.out


def test_code_versions_and_machines_split_or_are_unrecorded(tmp_path):
    a = sweep(tmp_path / "a", {"mha": MHA, "mqa": ({"attention": "mqa"}, 1.56)})
    b = sweep(tmp_path / "b", {"mha": MHA, "gqa": GQA4})
    c = sweep(tmp_path / "c", {"mha": MHA, "gqa2": GQA2})  # older runs: no provenance.json, agree with any

    def provenance(d: Path, commit: str, dirty: bool, gpu: str, diff: str | None = None) -> None:
        for run in d.glob("*/seed*"):
            doc = {"git": {"commit": commit, "dirty": dirty}, "hardware": {"gpu": gpu, "cpu": "x86"}}
            (run / "provenance.json").write_text(json.dumps({**doc, "config": yaml.safe_load(
                (run / ".hydra" / "config.yaml").read_text())}))  # fmt: skip
            if diff is not None:
                (run / "git.diff").write_text(diff)

    provenance(a, "a" * 40, False, "NVIDIA H100")
    docs_only = "diff --git a/docs/X.md b/docs/X.md\n+words\n"
    provenance(b, "a" * 40, True, "NVIDIA H100", docs_only)  # dirty outside gptlab/: the same code
    runs = [load_run(p) for d in (a, b, c) for p in sorted(d.glob("*/seed*"))]
    assert value(runs[0], "code") == "a" * 12 and value(runs[6], "code") == "a" * 12
    assert split_study(runs)[1] == []  # one study
    provenance(b, "a" * 40, True, "NVIDIA H200", "diff --git a/gptlab/x.py b/gptlab/x.py\n+1\n")
    runs = [load_run(p) for d in (a, b, c) for p in sorted(d.glob("*/seed*"))]
    assert value(runs[6], "code").startswith("a" * 12 + "+") and value(runs[6], "machine") == "NVIDIA H200"
    parts, keys, why = split_study(runs)
    assert keys == ["code", "machine"] and len(parts) == 2
    assert [sorted({value(r, "machine") for r in p.runs}) for p in parts] == [
        ["NVIDIA H100", "unset"],
        ["NVIDIA H200"],
    ]  # c's unrecorded runs join the first study they agree with


def test_under_split_by_a_part_still_mixing_studies_is_refused_in_one_line(tmp_path):
    a = sweep(tmp_path / "a", {"mha": MHA, "mqa": ({"attention": "mqa"}, 1.56)})
    b = sweep(tmp_path / "b", {"mha": MHA, "gqa": GQA4}, x={"schedule.warmup_steps": 10})
    req = modes.Request([str(a), str(b)], split_by=["attention"], out=str(tmp_path / "o"))
    with pytest.raises(ConfigError) as err:
        modes.tables(req)
    assert str(err.value) == (
        "[attention=mha] the sweeps were not run alike (schedule.warmup_steps: unset in a; 10 in b): they are not one "
        "study; add --split-by schedule.warmup_steps"
    )
    assert (
        main([str(a), str(b), "--split-by", "schedule.warmup_steps", "--out", str(tmp_path / "o"), "--no-wandb"]) == 0
    )


def test_a_baseline_matching_several_groups_is_refused_naming_them(tmp_path):
    """One sweep, two gqa arms (n_kv_head 4 and 2): `attention=gqa` used to pick whichever label read exactly so."""
    root = sweep(tmp_path / "s", {"mha": MHA, "gqa4": GQA4, "gqa2": GQA2})
    for seed in range(3):
        cfg = root / "gqa2" / f"seed{seed}" / ".hydra" / "config.yaml"
        doc = yaml.safe_load(cfg.read_text())
        doc["attention"]["n_kv_head"] = 3
        cfg.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as err:
        modes.tables(modes.Request([str(root)], baseline="attention=gqa", out=str(tmp_path / "o")))
    assert str(err.value).startswith(
        "--baseline 'attention=gqa' matches 2 groups (attention.n_kv_head=3; attention.n_kv_head=2); add what tells "
        "them apart, e.g. --baseline 'attention=gqa, attention.n_kv_head=3'"
    )
    found = modes.tables(
        modes.Request([str(root)], baseline="attention=gqa, attention.n_kv_head=2", out=str(tmp_path / "o"))
    )
    assert "attention.n_kv_head=2" in found.comparisons[0].rows[0].label  # the baseline asked for


def test_lr_grid_over_mixed_dirs_names_the_runs_it_left_out(tmp_path):
    """attn (no lr grid, seeds 0-2) beside attn_lr (seeds 0-1): the plain runs are named once as left out, and the
    grid's design keeps its own seeds (no "not run at lr ... (seeds 2)" for a seed that never belonged to it)."""
    from gptlab.compare.studies.lr_grid import read_grid, report

    attn = sweep(tmp_path / "attn", {"mha": MHA, "gqa4": GQA4})
    grid = sweep(tmp_path / "attn_lr", {"mha": MHA, "gqa4": GQA4}, seeds=(0, 1), lrs=[1e-3, 3e-3])
    doc = report(read_grid(attn, grid))
    said = [words.note(w) for w in doc.warnings]
    assert not any("not run at lr" in s for s in said), said
    [left] = [s for s in said if "left out of the lr grid" in s]
    assert left.startswith(f"warning: {attn}: 6 runs left out of the lr grid (not an lr grid sweep dir")
    assert "attn/gqa4/seed0" in left and left.endswith("(compare them without --lr-grid)")
    assert sorted({r.seed for row in read_grid(attn, grid).values() for r in row.runs}) == [0, 1]
