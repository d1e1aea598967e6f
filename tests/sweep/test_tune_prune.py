"""Pruned tune searches (gptlab/sweep/prune.py, hydra.sweeper.pruner): a trial's run reports its val loss at each eval
to its Optuna trial through a journal file both sides open, stops where the pruner says so, and is recorded as pruned
(TrialState.PRUNED, summary.json, optimization_results.yaml), never as a result; gptlab-compare leaves it out."""

from __future__ import annotations

import json
import math

import optuna
import pytest
import yaml
from hydra.core.utils import JobReturn, JobStatus
from optuna.trial import TrialState

from gptlab.cli.compare import main as compare_main
from gptlab.config.build import compose, group_choices
from gptlab.errors import ConfigError
from gptlab.state import checkpoint
from gptlab.sweep.prune import JOURNAL, TrialReport, make_pruner, open_storage
from gptlab.sweep.tune import run_study, search_space
from gptlab.train.run import execute
from gptlab.util.paths import CONF_DIR
from helpers.cli import cli_env, run_cli
from helpers.compare import write_run
from helpers.train import FAST, rows

PRESETS = sorted((CONF_DIR / "hydra" / "sweeper" / "pruner").glob("*.yaml"))
MEDIAN = {"_target_": "optuna.pruners.MedianPruner", "n_startup_trials": 1}
STEPS = [2, 4, 6, 8]  # the evals of a trial of 8 steps (step 0 is never reported)


def _good(k: int) -> list[float]:
    return [4.0 - 0.2 * i - 0.01 * k for i in range(len(STEPS))]


BAD = [4.3] * len(STEPS)  # a flat curve above every good one: lr 1e-6


def _trial_run(journal, number: int, node: dict, curve: list[float]) -> int | None:
    """What a trial's run does at its evals: report each through the hook; the step it was pruned at, or None."""
    report = TrialReport(str(journal), "s", number, node)
    for step, loss in zip(STEPS, curve):
        if report.at_eval(step, loss, last=step == STEPS[-1]):
            return step
    return None


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_each_pruner_preset_builds_its_pruner(preset):
    node = yaml.safe_load(preset.read_text())
    assert type(make_pruner(node)).__name__ == node["_target_"].rsplit(".", 1)[1]
    assert {p.stem for p in PRESETS} >= {"median", "successive_halving", "hyperband"}


@pytest.mark.parametrize(
    "node, message",
    [
        (
            {"_target_": "optuna.pruners.Nope"},
            r"^hydra.sweeper.pruner._target_: 'optuna.pruners.Nope' is not an Optuna pruner; allowed: "
            r".*optuna.pruners.HyperbandPruner, optuna.pruners.MedianPruner, .*SuccessiveHalvingPruner",
        ),
        (
            {"_target_": "optuna.samplers.TPESampler"},
            r"^hydra.sweeper.pruner._target_: 'optuna.samplers.TPESampler' is not an Optuna pruner; allowed: ",
        ),
        (
            {"_target_": "optuna.pruners.MedianPruner", "n_warmup": 2},
            r"^hydra.sweeper.pruner.n_warmup: not an argument of MedianPruner; allowed: n_startup_trials, "
            r"n_warmup_steps, interval_steps, n_min_trials$",
        ),
        (
            {"_target_": "optuna.pruners.MedianPruner", "n_warmup_steps": -1},
            r"^hydra.sweeper.pruner: MedianPruner refused its arguments: .*n_warmup_steps.*-1",
        ),
        ("median", r"^hydra.sweeper.pruner: give a node with _target_: one of .*, or null; got 'median'$"),
    ],
)
def test_a_bad_pruner_is_one_line_before_any_trial(tmp_path, node, message):
    with pytest.raises(ConfigError, match=message):
        make_pruner(node)
    calls = []
    with pytest.raises(ConfigError, match=message):
        _study(tmp_path, lambda overrides, first: calls.append(first), pruner=node)
    assert calls == [] and not (tmp_path / JOURNAL).exists()


def test_a_named_storage_needs_a_study_name_with_a_pruner(tmp_path):
    with pytest.raises(ConfigError, match=r"^hydra.sweeper.study_name: null with hydra.sweeper.storage and a pruner"):
        _study(
            tmp_path, lambda overrides, first: [], pruner=MEDIAN, storage=str(tmp_path / "s.journal"), study_name=None
        )


SMALL = {
    "median": {"n_startup_trials": 1},
    "successive_halving": {"min_resource": 2, "reduction_factor": 2},
    "hyperband": {"min_resource": 2, "max_resource": STEPS[-1], "reduction_factor": 2},
}


@pytest.mark.parametrize("preset", sorted(SMALL))
def test_the_hook_reports_each_eval_and_prunes_a_hopeless_curve(tmp_path, preset):
    """Real studies in a journal file, trials run as the hook runs them: good curves finish, a flat one is pruned at
    its first eval once there is something better at that step (hyperband: where its bracket holds one)."""
    node = yaml.safe_load((CONF_DIR / "hydra" / "sweeper" / "pruner" / f"{preset}.yaml").read_text())
    node |= SMALL[preset]  # pruning from the first finished trial, rungs at the 8-step trials' evals
    journal = tmp_path / JOURNAL
    study = optuna.create_study(study_name="s", storage=open_storage(str(journal)), pruner=make_pruner(node))
    curves = [_good(0), _good(1), BAD, _good(2), BAD, BAD]
    stopped = {}
    for curve in curves:
        trial = study.ask()
        stopped[trial.number] = _trial_run(journal, trial.number, node, curve)
        if stopped[trial.number] is None:
            study.tell(trial, curve[-1])
    states = {t.number: t.state for t in study.get_trials()}
    bad = [n for n, c in enumerate(curves) if c is BAD]
    assert all(states[n] == TrialState.COMPLETE and stopped[n] is None for n in range(len(curves)) if n not in bad)
    assert stopped[2] == 2 and states[2] == TrialState.PRUNED  # the first bad one, after two good ones
    assert all((states[n], stopped[n]) in ((TrialState.PRUNED, 2), (TrialState.COMPLETE, None)) for n in bad)
    if preset != "hyperband":  # hyperband compares a trial within its own bracket only
        assert all(states[n] == TrialState.PRUNED for n in bad)
    reported = study.get_trials()[2].intermediate_values
    assert reported == {2: 4.3}  # reported, then pruned: nothing after


def test_the_loop_stops_where_the_trial_says_and_records_pruned(tmp_path):
    """The loop reports every eval but the first (step 0: untrained) and the last with last=True; stopped at step 4,
    the run is "pruned": summary.json has pruned_at_step and no final or best val loss, metrics end at step 4."""

    class Trial:
        def __init__(self):
            self.calls = []

        def at_eval(self, step, val_loss, last):
            self.calls.append((step, last))
            return step == 4

    trial = Trial()
    args = [*FAST, "train.max_steps=8", "train.eval_interval=2", "model.n_layer=1", "model.d_model=32"]
    cfg = compose(args)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    summary = execute(cfg, run_dir, group_choices(cfg), args, trial=trial)
    assert trial.calls == [(2, False), (4, False)]
    on_disk = json.loads((run_dir / "summary.json").read_text())
    for s in (summary, on_disk):
        assert s["status"] == "pruned" and s["steps"] == 4 and s["pruned_at_step"] == 4
        assert s["final_val_loss"] is None and s["best_val_loss"] is None
    assert max(r["step"] for r in rows(run_dir)) == 4 and checkpoint.latest_path(run_dir) is None

    keep = Trial()
    keep.at_eval = lambda step, val_loss, last: bool(keep.calls.append((step, last)))  # never prunes
    (tmp_path / "kept").mkdir()
    whole = execute(cfg, tmp_path / "kept", group_choices(cfg), args, trial=keep)
    assert keep.calls == [(2, False), (4, False), (6, False), (8, True)]  # the last eval: reported, never pruned
    assert whole["status"] == "finished" and whole["final_val_loss"] is not None and "pruned_at_step" not in whole


def _job(overrides, value):
    job = JobReturn(overrides=overrides)
    job.status, job.return_value = JobStatus.COMPLETED, value
    return job


def _study(tmp_path, launch, **kw):
    space, fixed = search_space({"optimizer.lr": "choice(0.003, 1e-6, 3.0)"}, ["train.max_steps=8"])
    settings = dict(direction="minimize", study_name="s", storage=None, n_trials=3, n_jobs=1, max_failure_rate=0.0)
    return run_study(launch, space=space, fixed=fixed, seed=28, sweep_dir=tmp_path, **(settings | kw))


def test_the_sweeper_counts_a_pruned_trial_as_neither_result_nor_failure(tmp_path):
    """A launcher stand-in whose jobs run as a run does: report through the trial the sweeper named on the job
    (+hydra.sweeper.trial=N) in the sweep dir's journal; return None when pruned, as gptlab-train does."""
    journal = tmp_path / JOURNAL

    def launch(overrides, first):
        out = []
        for ov in overrides:
            given = dict(o.lstrip("+").split("=", 1) for o in ov)
            curve = {0.003: _good(0), 1e-6: BAD, 3.0: [9.0] * 4}[float(given["optimizer.lr"])]
            stopped = _trial_run(journal, int(given["hydra.sweeper.trial"]), MEDIAN, curve)
            out.append(_job(ov, None if stopped else curve[-1]))
        return out

    study = _study(tmp_path, launch, pruner=MEDIAN)
    lr = {t.number: t.params["optimizer.lr"] for t in study.trials}
    assert lr == {0: 0.003, 1: 1e-6, 2: 3.0}, "seed 28 no longer asks the good lr first: pick another seed"
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.PRUNED]
    result = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert result["failed"] == 0 and result["pruned"] == 2 and result["best_params"] == {"optimizer.lr": 0.003}
    assert result["pruned_trials"] == [
        {"number": 1, "params": {"optimizer.lr": 1e-6}, "step": 2},
        {"number": 2, "params": {"optimizer.lr": 3.0}, "step": 2},
    ]


def test_without_a_pruner_jobs_get_no_trial_and_no_journal(tmp_path):
    seen = []

    def launch(overrides, first):
        seen.extend(overrides)
        return [_job(ov, 1.0) for ov in overrides]

    _study(tmp_path, launch)
    assert not any("hydra.sweeper.trial" in o for ov in seen for o in ov) and not (tmp_path / JOURNAL).exists()


TINY = [
    "model.n_layer=1",
    "model.d_model=32",
    "model.n_head=2",
    "model.block_size=32",
    "train.batch_size=8",
    "train.eval_sequences=8",
    "train.max_steps=8",
    "train.eval_interval=2",
    "train.log_interval=2",
    "sample.tokens=0",
    "logger=none",
    "hardware.dtype=fp32",
    "hardware.peak_flops=1e12",
    "schedule.warmup_steps=0",
]


def test_a_real_search_prunes_the_hopeless_lrs_early(tmp_path, capsys):
    """gptlab-train -m +tune=lr with the median pruner over lr 3e-3 (asked first: seed 28), 1e-6 (flat) and 3.0
    (val loss ~170 at step 2): both bad lrs stop at their first eval, step 2 of 8, as PRUNED trials and pruned runs;
    the best trial is 3e-3, COMPLETE; gptlab-compare leaves the pruned runs out with a note."""
    out = tmp_path / "tune"
    proc = run_cli(
        "gptlab.cli.train", "-m", "+tune=lr", "hydra/sweeper/pruner=median", "hydra.sweeper.pruner.n_startup_trials=1",
        "hydra.sweeper.n_trials=3", "hydra.sweeper.seed=28", "optimizer.lr=choice(0.003,1e-6,3.0)", *TINY,
        f"hydra.sweep.dir={out}", cwd=tmp_path, env=cli_env(OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    storage = open_storage(str(out / JOURNAL))
    study = optuna.load_study(study_name="tune-lr", storage=storage)
    by_lr = {t.params["optimizer.lr"]: t for t in study.trials}
    assert [t.params["optimizer.lr"] for t in study.trials] == [0.003, 1e-6, 3.0], "seed 28's order changed"
    assert study.best_trial.params == {"optimizer.lr": 0.003} and study.best_trial.state == TrialState.COMPLETE
    for lr in (1e-6, 3.0):
        assert by_lr[lr].state == TrialState.PRUNED and by_lr[lr].last_step == 2
        run = out / str(by_lr[lr].number)  # job num = trial number in a fresh study
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "pruned" and summary["pruned_at_step"] == 2 and summary["steps"] == 2 < 8
        assert summary["final_val_loss"] is None and max(r["step"] for r in rows(run)) == 2
    best = json.loads((out / "0" / "summary.json").read_text())
    assert best["status"] == "finished" and best["final_val_loss"] == pytest.approx(study.best_value)
    result = yaml.safe_load((out / "optimization_results.yaml").read_text())
    assert result["pruned"] == 2 and result["failed"] == 0 and [t["step"] for t in result["pruned_trials"]] == [2, 2]
    assert math.isclose(result["best_value"], study.best_value)

    capsys.readouterr()
    assert compare_main([str(out), "--out", str(tmp_path / "cmp"), "--no-wandb"]) == 0
    err = capsys.readouterr().err
    assert "note: 2 run(s) pruned by the tune search's pruner are left out" in err and "1 (step 2), 2 (step 2)" in err
    compared = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert compared["step"] == 8  # the finished run's last eval, not the pruned runs' step 2


def test_compare_leaves_pruned_runs_out_of_verdicts(tmp_path, capsys):
    """Two finished arms and a pruned run of a third: the table and its verdicts are the two, at their last step."""
    write_run(tmp_path / "runs" / "a", max_steps=100)
    write_run(tmp_path / "runs" / "b", choices={"mlp": "swiglu"}, max_steps=100)
    pruned = write_run(tmp_path / "runs" / "c", choices={"mlp": "relu2"}, max_steps=100, stop_at=25, status="pruned")
    summary = json.loads((pruned / "summary.json").read_text())
    (pruned / "summary.json").write_text(json.dumps(summary | {"pruned_at_step": 25, "final_val_loss": None}))
    assert compare_main([str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--no-wandb"]) == 0
    err = capsys.readouterr().err
    assert "note: 1 run(s) pruned by the tune search's pruner are left out" in err and "c (step 25)" in err
    doc = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert doc["step"] == 100 and len(doc["rows"]) == 2

    write_run(tmp_path / "only" / "c", max_steps=100, stop_at=25, status="pruned")
    assert compare_main([str(tmp_path / "only"), "--out", str(tmp_path / "out2"), "--no-wandb"]) == 2
    assert "all 1 runs were pruned by a tune search's pruner" in capsys.readouterr().err


def test_gptlab_train_refuses_a_bad_pruner_in_one_line(tmp_path):
    out = tmp_path / "tune"
    proc = run_cli(
        "gptlab.cli.train", "-m", "+tune=lr", "hydra/sweeper/pruner=median", "+hydra.sweeper.pruner.n_warmup=2",
        f"hydra.sweep.dir={out}", cwd=tmp_path, env=cli_env(HYDRA_FULL_ERROR="0"),
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: hydra.sweeper.pruner.n_warmup: not an argument of MedianPruner; allowed: n_startup_trials, "
        "n_warmup_steps, interval_steps, n_min_trials"
    ], proc.stderr
    assert not any(out.glob("*/summary.json"))  # no trial ran
