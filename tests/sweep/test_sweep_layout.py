"""The sweep dir layout is one definition (gptlab/sweep/layout.py): every path part it formats parses back to the
same value, and a sweep dir the planner writes reads back as the arms, seeds, lrs, rungs and factors it was given."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gptlab.errors import ConfigError
from gptlab.sweep.design import factorial_arms, parse_ladder, rungs
from gptlab.sweep.layout import (
    BASE_ARM,
    PLAN_FILE,
    SWEEP_FILE,
    cell_arm,
    cell_factors,
    is_arm_name,
    lr_part,
    parse_lr_part,
    parse_rung_part,
    parse_seed_part,
    planned_subdir,
    read_plan,
    read_sweep,
    run_name,
    run_subdir,
    rung_name,
    seed_part,
)
from gptlab.sweep.plan import pending, write_plan
from gptlab.sweep.spec import record_definition, resolve

LRS = {1e-3: "lr0.001", 3e-4: "lr0.0003", 0.01: "lr0.01", 10.0: "lr10", 1e-5: "lr1e-05", 2.5e-4: "lr0.00025"}


@pytest.mark.parametrize("seed", [0, 1, 7, 12345, 2**63 - 1])
def test_seed_part_round_trips(seed):
    assert seed_part(seed) == f"seed{seed}"
    assert parse_seed_part(seed_part(seed)) == seed


@pytest.mark.parametrize("lr", sorted(LRS))
def test_lr_part_round_trips(lr):
    assert lr_part(lr) == LRS[lr]
    assert parse_lr_part(lr_part(lr)) == lr


@pytest.mark.parametrize("name", ["seed", "seedx", "seed-1", "Seed0", "lr", "lr.", "lre", "lr1e-3x", "d_model64"])
def test_other_names_parse_as_nothing(name):
    assert parse_seed_part(name) is None
    assert parse_lr_part(name) is None


def test_rung_names_round_trip_and_are_told_from_lr_and_seed_folders():
    for ladder, names in [
        ({"model.d_model": ["64", "128"]}, ["d_model64", "d_model128"]),
        ({"model.n_layer": ["2", "4"], "model.d_model": ["64", "128"]}, ["n_layer2-d_model64", "n_layer4-d_model128"]),
        ({"model": ["tiny", "gpt2-medium"]}, ["tiny", "gpt2-medium"]),
    ]:
        built = rungs(parse_ladder(ladder))
        assert [r.name for r in built] == names
        assert [rung_name((o.split("=")[0], o.split("=")[1]) for o in r.overrides) for r in built] == names
        assert [parse_rung_part(n) for n in names] == names
    assert [parse_rung_part(n) for n in ("lr0.001", "lr1e-05", "seed0", ".plan", "a+b", "")] == [None] * 6


def test_factorial_cells_round_trip():
    factors = {"gqa": ["attention=gqa"], "sdpa": ["attention.impl=sdpa"], "swiglu": ["mlp=swiglu"]}
    arms = factorial_arms(factors)
    assert len(arms) == 8 and next(iter(arms)) == BASE_ARM
    for arm, overrides in arms.items():
        on = cell_factors(arm)
        assert cell_arm(on) == arm and is_arm_name(arm)
        assert overrides == [o for f in on for o in factors[f]]
    assert cell_arm([]) == BASE_ARM and cell_factors(BASE_ARM) == []
    assert cell_factors("gqa+sdpa") == ["gqa", "sdpa"]


@pytest.mark.parametrize(
    "lr, rung, subdir, name",
    [
        (None, None, "gqa/seed3", "gqa__seed3"),
        (3e-4, None, "gqa/lr0.0003/seed3", "gqa__lr0.0003__seed3"),
        (None, "d_model64", "gqa/d_model64/seed3", "gqa__d_model64__seed3"),
    ],
)
def test_run_subdir_and_name_parse_back(lr, rung, subdir, name):
    assert run_subdir("gqa", 3, lr, rung) == subdir and run_name("gqa", 3, lr, rung) == name
    arm, *middle, seed = subdir.split("/")
    assert is_arm_name(arm) and parse_seed_part(seed) == 3
    if lr is not None:
        assert parse_lr_part(middle[0]) == lr and parse_rung_part(middle[0]) is None
    if rung is not None:
        assert parse_rung_part(middle[0]) == rung and parse_lr_part(middle[0]) is None


def test_arm_names():
    assert all(is_arm_name(a) for a in ("base", "gqa+sdpa", "aa0", "d12", "lr-high", "x.y_z"))
    assert not any(is_arm_name(a) for a in (".plan", ".submitit", "a__b", "a/b", "", "-x", "a b"))


def test_plan_entries_name_their_run_dirs():
    assert planned_subdir({"name": "a__lr0.001__seed1", "subdir": "a/lr0.001/seed1"}) == "a/lr0.001/seed1"
    assert planned_subdir({"arm": "a", "seed": 2}) == "a/seed2"  # a plan written before entries had `subdir`
    assert [planned_subdir(e) for e in (None, [], {"arm": "a"}, {"subdir": ""})] == [None] * 4


def test_read_sweep_absent_damaged_and_lenient(tmp_path):
    assert read_sweep(tmp_path) is None
    (tmp_path / SWEEP_FILE).write_text("")
    empty = read_sweep(tmp_path)
    assert empty is not None and (empty.arms, empty.seeds, empty.lrs, empty.ladder) == ([], [0], None, None)
    for bad, why in [
        ("arms: {a: [x=1]\nseeds: [0", "not valid YAML"),
        ("[1, 2]", "not a sweep record"),
        ("arms: [a, b]", "arms: ['a', 'b']"),
        ("seeds: [0, x]", "seeds: [0, 'x']"),
        ("lr_grid: 0,-1", "lr grid '0,-1'"),
        ("ladder: model.d_model=64,128", "ladder: 'model.d_model=64,128'"),
    ]:
        (tmp_path / SWEEP_FILE).write_text(bad)
        with pytest.raises(ConfigError, match=f"^{re.escape(str(tmp_path / SWEEP_FILE))}: ") as err:
            read_sweep(tmp_path)
        assert why in str(err.value)
        assert read_sweep(tmp_path, strict=False) is None


def _sweep_file(tmp_path: Path, doc: dict) -> str:
    path = tmp_path / "mini.yaml"
    path.write_text(yaml.safe_dump({"overrides": ["model=tiny"], **doc}, sort_keys=False))
    return str(path)


def _planned(tmp_path: Path, doc: dict, **given) -> tuple[Path, list]:
    """The sweep dir gptlab-sweep writes for `doc` (sweep.yaml and the plan; each run dir made, as Hydra would)."""
    sweep = resolve(_sweep_file(tmp_path, doc), [], out=tmp_path / "out", note=lambda line: None, **given)
    record_definition(sweep.sweep_dir, sweep.spec, sweep.extra)
    todo = pending(sweep.name, sweep.spec, sweep.seeds, sweep.sweep_dir, sweep.extra, sweep.lrs, sweep.ladder)
    write_plan(sweep.sweep_dir, todo.runs)
    for run in todo.runs:
        run.run_dir(sweep.sweep_dir).mkdir(parents=True)
    return sweep.sweep_dir, todo.runs


def _read_back(sweep_dir: Path) -> set[tuple[str, float | str | None, int]]:
    """(arm, lr or rung or None, seed) of every run dir, parsed from the folders alone."""
    found = set()
    for path in sweep_dir.rglob("seed*"):
        parts = path.relative_to(sweep_dir).parts
        assert is_arm_name(parts[0]) and parse_seed_part(parts[-1]) is not None, path
        middle = None if len(parts) == 2 else parse_lr_part(parts[1]) or parse_rung_part(parts[1])
        found.add((parts[0], middle, parse_seed_part(parts[-1])))
    return found


def test_an_lr_grid_the_planner_writes_reads_back(tmp_path):
    arms = {"base": [], "wide": ["model.d_model=64"]}
    doc = {"arms": arms, "seeds": [0, 3], "overrides": ["model=tiny", "optimizer.weight_decay=0"]}  # lr 10 can start
    sweep_dir, runs = _planned(tmp_path, doc, lr_grid="1e-3,3e-4,0.01,10")
    recorded = read_sweep(sweep_dir)
    assert recorded is not None
    assert (recorded.arms, recorded.seeds, recorded.lrs) == (["base", "wide"], [0, 3], [1e-3, 3e-4, 0.01, 10.0])
    wanted = {(a, lr, s) for a in arms for lr in (1e-3, 3e-4, 0.01, 10.0) for s in (0, 3)}
    assert _read_back(sweep_dir) == wanted and len(runs) == 16
    assert {sweep_dir / planned_subdir(e) for e in read_plan(sweep_dir)} == {r.run_dir(sweep_dir) for r in runs}
    assert (sweep_dir / PLAN_FILE).is_file()


def test_a_ladder_the_planner_writes_reads_back(tmp_path):
    sweep_dir, _ = _planned(
        tmp_path, {"arms": {"mha": [], "mqa": ["attention=mqa"]}, "seeds": [1]}, ladder=["model.d_model=32,64"]
    )
    recorded = read_sweep(sweep_dir)
    assert recorded is not None and recorded.ladder == {"model.d_model": ["32", "64"]}
    assert [r.name for r in rungs(parse_ladder(recorded.ladder))] == ["d_model32", "d_model64"]
    assert _read_back(sweep_dir) == {(a, r, 1) for a in ("mha", "mqa") for r in ("d_model32", "d_model64")}


def test_a_factorial_the_planner_writes_reads_back(tmp_path):
    factors = {"gqa": ["attention=gqa"], "swiglu": ["mlp=swiglu"]}
    sweep_dir, _ = _planned(tmp_path, {"factors": factors, "seeds": [0, 1]}, factorial=True)
    recorded = read_sweep(sweep_dir)
    assert recorded is not None and recorded.factors == ["gqa", "swiglu"]
    assert recorded.arms == ["base", "gqa", "swiglu", "gqa+swiglu"]
    assert {frozenset(cell_factors(a)) for a, _, _ in _read_back(sweep_dir)} == {
        frozenset(),
        frozenset({"gqa"}),
        frozenset({"swiglu"}),
        frozenset({"gqa", "swiglu"}),
    }
    assert _read_back(sweep_dir) == {(a, None, s) for a in recorded.arms for s in (0, 1)}


def test_compare_reads_the_grid_the_planner_writes(tmp_path):
    from gptlab.compare.studies.lr_grid import read_grid

    sweep_dir, runs = _planned(tmp_path, {"arms": {"wide": [], "base": []}, "seeds": [0, 2]}, lr_grid="3e-4,1e-3")
    for run in runs:
        summary = {"status": "finished", "final_val_loss": 3.0}
        (run.run_dir(sweep_dir) / "summary.json").write_text(json.dumps(summary))
        (run.run_dir(sweep_dir) / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/loss": 4.0}) + "\n")
    curves = read_grid(sweep_dir)
    assert list(curves) == ["wide", "base"]  # sweep.yaml's order, not the folders'
    assert {(c.arm, r.lr, r.seed) for c in curves.values() for r in c.runs} == {
        (a, lr, s) for a in ("wide", "base") for lr in (3e-4, 1e-3) for s in (0, 2)
    }


def test_the_layout_imports_nothing_heavy():
    code = "import sys, gptlab.sweep.layout; print('\\n'.join(sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = {m.split(".")[0] for m in done.stdout.split()}
    assert "yaml" in loaded and not loaded & {"torch", "hydra", "omegaconf", "numpy"}
    assert {m for m in done.stdout.split() if m.startswith("gptlab.")} == {
        "gptlab.errors",
        "gptlab.sweep",
        "gptlab.sweep.layout",
        "gptlab.util",
        "gptlab.util.checks",  # the stored files' validators (stdlib only)
        "gptlab.util.stored",
    }


_PATH_TEXT = (
    st.lists(
        st.sampled_from(list("ab/ .,=:'\"\\[]{}$()-_é漢") + ["${", "${x}", "\\'", "/a b/"]), min_size=1, max_size=12
    )
    .map("".join)
    .map(lambda s: "/tmp/" + s)
)


@pytest.mark.slow  # 120 Hydra composes: 27 s on 2026-11-28's machine, 35-38 s on 2026-11-29's (the 30 s budget)
@settings(max_examples=120, deadline=None)
@given(value=_PATH_TEXT)
def test_every_path_the_sweep_writes_reads_back_through_hydra_exactly(value):
    """The sweep writes its dirs into overrides (hydra.run.dir, hydra.sweep.dir, hydra.searchpath) through `quoted`:
    whatever the folder is called (spaces, quotes, commas, backslashes, non-ASCII, `${x}` that OmegaConf would
    resolve as an interpolation), Hydra must hand the run back the same string."""
    from gptlab.config.build import compose
    from gptlab.sweep.plan import quoted

    assert compose([f"hydra.run.dir={quoted(value)}"]).hydra.run.dir == value
