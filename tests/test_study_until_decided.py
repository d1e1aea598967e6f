"""gptlab/study/until_decided.py as a library: the plan refused as values (ConfigError) before anything is written, and
the looks run through a caller's launch, reported through on_look, ended as an Outcome (nothing printed). The runs
are stand-ins written as finished run dirs; tests/sweep/test_until_decided.py runs the CLI over real ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gptlab.compare.statistics.sequential import plan
from gptlab.compare.studies.until_decided import RECORD_FILE, read_record, write_record
from gptlab.errors import ConfigError
from gptlab.study.until_decided import baseline, plan_for, run
from gptlab.sweep.spec import record_definition, resolve
from helpers.compare import write_run


def _sweep(tmp_path: Path, arms: dict, write: bool = True):
    """The sweep as gptlab-sweep resolves it, its definition recorded in the sweep dir (not under a dry run)."""
    path = tmp_path / "ud.yaml"
    spec = {"seeds": [0, 1], "overrides": ["model=tiny", "logger=none"], "arms": arms}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    sweep = resolve(str(path), [], out=tmp_path / "out", note=lambda line: None)
    record_definition(sweep.sweep_dir, sweep.spec, sweep.extra, sweep.seeds, write=write)
    return sweep


def _finish(sweep, todo, finals: dict[str, float]) -> list[str]:
    """A launch whose runs finish at once: each arm's final val loss, plus a little per seed."""
    for r in todo.runs:
        loss = finals[r.name.split("__")[0]] + 0.01 * r.seed
        write_run(r.run_dir(sweep.sweep_dir), seed=r.seed, loss_at=lambda step, v=loss: v)
    return []


def test_the_plan_is_refused_as_a_value_before_anything_is_written(tmp_path):
    one = _sweep(tmp_path, {"base": []}, write=False)
    with pytest.raises(ConfigError, match="needs a baseline"):
        plan_for(one, 4)
    two = _sweep(tmp_path, {"base": [], "b": ["mlp.ratio=2"]}, write=False)
    assert baseline(two) == "base" and plan_for(two, 4).seeds == (2, 3, 4)
    two.sweep_dir.mkdir()
    write_record(two.sweep_dir, plan(2, 1, 4), "base", [])
    assert plan_for(two, 4).seeds == (2, 3, 4)  # the recorded plan continues
    with pytest.raises(ConfigError, match=r"records looks of another plan: --max-seeds 6 \(recorded: 4\)"):
        plan_for(two, 6)
    assert sorted(p.name for p in two.sweep_dir.iterdir()) == [RECORD_FILE]


def test_seeds_go_only_to_the_open_arm_and_the_looks_come_back_as_values(tmp_path):
    sweep = _sweep(tmp_path, {"base": [], "same": [], "far": ["mlp.ratio=2"]})
    design = plan_for(sweep, 3)
    launched: list[list[str]] = []
    heard: list[list[str]] = []

    def launch(todo):
        launched.append(sorted(r.name for r in todo.runs))
        return _finish(sweep, todo, {"base": 2.0, "same": 2.0, "far": 3.0})

    done = run(sweep, design, launch, on_look=lambda found: heard.append(sorted(found)))
    assert launched[0] == ["base__seed0", "base__seed1", "far__seed0", "far__seed1", "same__seed0", "same__seed1"]
    # 'far' was decided at look 1: no third seed (the stand-ins' configs are not the plan's: they are planned again)
    assert len(launched) == 2 and {"base__seed2", "same__seed2"} <= set(launched[1])
    assert not any(name.startswith("far") for name in launched[1])
    assert heard == [["far", "same"], ["same"]] and [sorted(taken) for taken in done.looks] == heard
    assert done.looks[0]["far"].decided and not done.looks[1]["same"].decided and done.failed == []
    assert done.record == sweep.sweep_dir / RECORD_FILE and read_record(sweep.sweep_dir)["finished"] is True


def test_failed_runs_stop_the_plan_before_their_look_and_leave_it_on_record(tmp_path):
    sweep = _sweep(tmp_path, {"base": [], "b": ["mlp.ratio=2"]})
    design = plan_for(sweep, 4)
    calls = []

    def launch(todo):
        calls.append(len(todo.runs))
        if len(calls) == 2:
            return [todo.runs[0].name]  # one of look 2's runs failed
        return _finish(sweep, todo, {"base": 2.0, "b": 2.0})

    done = run(sweep, design, launch)
    assert calls[0] == 4 and len(calls) == 2 and len(done.looks) == 1 and len(done.failed) == 1 and done.record is None
    doc = read_record(sweep.sweep_dir)
    assert doc is not None and doc["finished"] is False and len(doc["looks"]) == 1


def test_a_dry_run_plans_the_first_look_and_writes_nothing(tmp_path):
    sweep = _sweep(tmp_path, {"base": [], "b": ["mlp.ratio=2"]}, write=False)
    launched = []
    done = run(sweep, plan_for(sweep, 4), lambda todo: launched.append(len(todo.runs)) or [], dry_run=True)
    assert launched == [4] and done.looks == [] and done.record is None and not sweep.sweep_dir.exists()
