"""The timing session of a sweep (gptlab/study/timing.py): a real tiny sweep, planned as gptlab-sweep plans it and its
runs trained in-process, timed into its timing.json, read back by compare (gptlab/compare/reading/timing.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from gptlab.compare.reading import timing as reading
from gptlab.compare.reading.group import group_runs
from gptlab.compare.reading.runs import discover, load_run
from gptlab.config.build import compose, group_choices, plain_config
from gptlab.errors import ConfigError
from gptlab.study.timing import session_due, time_runs, time_sweep
from gptlab.sweep import layout
from gptlab.sweep.plan import pending, write_plan
from gptlab.sweep.spec import record_definition, resolve
from gptlab.train import timing
from gptlab.train.run import execute
from helpers.train import FAST, TINY

ROUNDS, STEPS, WARMUP = 2, 2, 1
# base trains seed 1 only (its lowest finished seed), relu2 both seeds, never none
TRAINED = ("base__seed1", "relu2__seed0", "relu2__seed1")


def _sweep_file(tmp: Path) -> Path:
    path = tmp / "tsweep.yaml"
    shared = [*FAST, *TINY, "train.prefetch=0", "train.max_steps=2", "train.eval_interval=2"]
    arms = {"base": [], "relu2": ["mlp=relu2"], "never": ["mlp.ratio=2"]}
    path.write_text(yaml.safe_dump({"seeds": [0, 1], "overrides": shared, "arms": arms}, sort_keys=False))
    return path


def _train(run, sweep_dir: Path) -> None:
    """One planned run trained as the local queue's gptlab-train would: its config, its run dir, .hydra saved."""
    cfg = compose(list(run.overrides))
    run_dir = run.run_dir(sweep_dir)
    run_dir.mkdir(parents=True)
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.create(plain_config(cfg)), run_dir / ".hydra" / "config.yaml")
    assert execute(cfg, run_dir, group_choices(cfg), list(run.overrides))["status"] == "finished"


@pytest.fixture(scope="module")
def timed(tmp_path_factory):
    """The sweep trained (TRAINED only), due for timing before its session, then timed."""
    tmp = tmp_path_factory.mktemp("study_timing")
    sweep = resolve(str(_sweep_file(tmp)), [], out=tmp / "sweep", note=lambda line: None)
    record_definition(sweep.sweep_dir, sweep.spec, sweep.extra, sweep.seeds)
    runs = [r for r in pending(sweep.name, sweep.spec, sweep.seeds, sweep.sweep_dir, sweep.extra).runs
            if r.name in TRAINED]  # fmt: skip
    write_plan(sweep.sweep_dir, runs)
    for run in runs:
        _train(run, sweep.sweep_dir)
    due = session_due(sweep.sweep_dir)
    heard: list[dict] = []
    done = time_sweep(sweep.sweep_dir, rounds=ROUNDS, steps=STEPS, warmup=WARMUP, on_window=heard.append)
    return sweep.sweep_dir, done, due, heard


def test_a_sweep_is_timed_into_its_timing_json_with_every_arm_that_finished(timed):
    sweep_dir, done, due, heard = timed
    assert due is True and session_due(sweep_dir) is False  # due once its runs are done, not once it is timed
    assert done.path == sweep_dir / layout.TIMING_FILE and layout.TIMING_FILE == timing.TIMING_FILE
    stored = json.loads(done.path.read_text())
    assert stored == json.loads(json.dumps(done.doc)) and stored["status"] == "finished"
    assert done.baseline == stored["baseline"] == "base" and done.left_out == ("never",)
    picked = {a["name"]: Path(a["run_dir"]) for a in stored["plan"]["arms"]}
    assert picked == {"base": sweep_dir / "base" / "seed1", "relu2": sweep_dir / "relu2" / "seed0"}
    assert stored["plan"]["seed"] == 0 and stored["plan"]["steps"] == STEPS  # the sweep's first seed orders it
    assert done.timed_now == len(heard) == ROUNDS * 3 == len(stored["windows"])
    assert set(stored["arms"]) == {"base", "relu2"}


def test_a_rerun_times_nothing_new(timed, monkeypatch):
    sweep_dir, done, _, _ = timed
    monkeypatch.setattr(timing, "measure_peak", lambda hardware: pytest.fail("a complete session measures nothing"))
    again = time_sweep(sweep_dir)  # rounds, steps, warmup and seed: the stored session's
    assert again.timed_now == 0 and again.doc["windows"] == done.doc["windows"] and again.arms == done.arms
    with pytest.raises(ConfigError, match=f"^{sweep_dir / layout.TIMING_FILE}: the session it records has other"):
        time_sweep(sweep_dir, steps=STEPS + 1)


def test_compare_reads_the_session_and_matches_it_to_the_sweeps_groups(timed):
    sweep_dir, done, _, _ = timed
    session = reading.read_timing(done.path)
    assert session is not None and session.source.rounds == ROUNDS and session.source.finished
    assert reading.VERSION == timing.VERSION
    runs = [load_run(p) for p in discover([str(sweep_dir)])]
    assert reading.find_timings(runs) == [session]
    found = reading.match(session, group_runs(runs))
    assert sorted((g.runs[0].config["arm"], a.name) for g, a in found.timed) == [("base", "base"), ("relu2", "relu2")]
    assert found.untimed == found.unmatched == found.mismatched == []
    # the timed arm's settings are the ones its runs recorded, and MFU the session's own arithmetic
    relu2 = session.arms["relu2"]
    assert relu2.settings == reading.run_settings(runs[1]) and relu2.settings["threads"] >= 1
    assert relu2.mfu == pytest.approx(done.doc["arms"]["relu2"]["flops_per_token"] * relu2.tokens_per_s /
                                      done.doc["peak"]["flops"])  # fmt: skip
    # whichever of its runs a report holds, relu2's MFU and equal-time seconds are the same numbers
    for subset in ([sweep_dir / "relu2" / "seed1"], [sweep_dir / "relu2" / "seed0", sweep_dir / "base" / "seed1"]):
        groups = group_runs([load_run(p.resolve()) for p in subset])
        arm = next(a for _, a in reading.match(session, groups).timed if a.name == "relu2")
        assert (arm.mfu, arm.seconds(100)) == (relu2.mfu, relu2.seconds(100))


def test_a_damaged_timing_json_is_refused_in_one_line(timed, tmp_path):
    sweep_dir, _, _, _ = timed
    copy = tmp_path / "sweep"
    shutil.copytree(sweep_dir, copy)
    (copy / layout.TIMING_FILE).write_text('{"version": 1, "plan": ')
    for call in (lambda: time_sweep(copy), lambda: reading.read_timing(copy / layout.TIMING_FILE)):
        with pytest.raises(ConfigError, match=rf"^{copy / layout.TIMING_FILE}: not valid JSON") as err:
            call()
        assert "\n" not in str(err.value)
    assert session_due(copy) is False  # a damaged session is not run over: the CLI says why


def test_sweeps_a_session_cannot_time_are_refused_in_one_line(timed, tmp_path):
    sweep_dir, _, _, _ = timed
    with pytest.raises(ConfigError, match="is not a gptlab-sweep dir"):
        time_sweep(tmp_path)
    alone = tmp_path / "alone"
    shutil.copytree(sweep_dir, alone, ignore=shutil.ignore_patterns("relu2", layout.TIMING_FILE))
    with pytest.raises(ConfigError, match="only the baseline base has a finished run .left out: relu2, never.; a"):
        time_sweep(alone)
    headless = tmp_path / "headless"
    shutil.copytree(sweep_dir, headless, ignore=shutil.ignore_patterns("base", layout.TIMING_FILE))
    with pytest.raises(ConfigError, match="the baseline base has no finished run"):
        time_sweep(headless)
    with pytest.raises(ConfigError, match="baseline 'nope' is not an arm"):
        time_sweep(headless, baseline="nope")


def test_run_dirs_are_timed_by_group_with_compares_baseline(timed, tmp_path):
    sweep_dir, _, _, _ = timed
    dirs = [sweep_dir / "relu2" / "seed1", sweep_dir / "relu2" / "seed0", sweep_dir / "base" / "seed1"]
    done = time_runs(dirs, tmp_path / "t", baseline=str(sweep_dir / "base" / "seed1"), rounds=1, steps=1, warmup=1)
    picked = {a.name: a.run_dir for a in done.arms}
    assert done.baseline == "base" and picked == {"base": dirs[2].resolve(), "relu2": dirs[1].resolve()}
    assert done.path == tmp_path / "t" / layout.TIMING_FILE and done.timed_now == 3 and done.left_out == ()
