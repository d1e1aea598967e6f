"""gptlab's Optuna sweeper (gptlab/sweep/tune.py): the search space from Hydra's sweep syntax, and the ask/launch/tell
loop with a launcher stand-in that returns Hydra's own JobReturn objects (the loss is a known function of the
parameters, so the study's best can be checked). The real sweeper through gptlab-train -m +tune=lr is in
test_sweeps.py (slow)."""

from __future__ import annotations

import math

import optuna
import pytest
import yaml
from hydra.core.utils import JobReturn, JobStatus

from gptlab.errors import ConfigError
from gptlab.sweep.tune import run_study, search_space


def test_search_space_from_params_and_the_command_line():
    space, fixed = search_space(
        {"optimizer": {"lr": "tag(log, interval(1e-4, 1e-2))"}, "model.n_layer": "range(2, 8, 2)"},
        ["attention=gqa", "optimizer.weight_decay=interval(0.0, 0.2)", "mlp=choice(gelu, swiglu)", "train.max_steps=5"],
    )
    assert fixed == ["attention=gqa", "train.max_steps=5"]
    assert space["optimizer.lr"] == optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)
    assert space["model.n_layer"] == optuna.distributions.IntDistribution(2, 6, step=2)
    assert space["optimizer.weight_decay"] == optuna.distributions.FloatDistribution(0.0, 0.2)
    assert space["mlp"] == optuna.distributions.CategoricalDistribution(["gelu", "swiglu"])
    assert search_space({"train.batch_size": "range(8, 65, 8)"}, [])[0]["train.batch_size"] == (
        optuna.distributions.IntDistribution(8, 64, step=8)
    )


@pytest.mark.parametrize(
    "params, args, message",
    [
        (
            {"optimizer.lr": "0.01"},
            [],
            r"^optimizer.lr: a tune search dimension must be interval\(a,b\), .*got 'optimizer.lr=0.01'$",
        ),
        ({}, ["train.max_steps=5"], r"^hydra.sweeper.params: nothing to search; give e.g. "),
        (  # an interval given high to low was Optuna's ValueError, a traceback
            {"optimizer.lr": "interval(0.1, 0.01)"},
            [],
            r"^optimizer.lr: interval\(0.1, 0.01\) in a tune search: give finite bounds low to high",
        ),
        (  # so was a log interval reaching 0 or below
            {},
            ["optimizer.lr=tag(log, interval(0, 0.1))"],
            r"^optimizer.lr: tag\(log, interval\(0, 0.1\)\) in a tune search: a log-scale interval needs both bounds > 0$",
        ),
        (
            {"optimizer.lr": "tag(log, interval(-1e-3, 1e-2))"},
            [],
            r"^optimizer.lr: tag\(log, interval\(-0.001, 0.01\)\) .*needs both bounds > 0$",
        ),
    ],
)
def test_search_space_refuses_what_it_cannot_search(params, args, message):
    with pytest.raises(ConfigError, match=message):
        search_space(params, args)


def _job(overrides, value):
    job = JobReturn(overrides=overrides)
    if isinstance(value, Exception):
        job.status, job.return_value = JobStatus.FAILED, value
    else:
        job.status, job.return_value = JobStatus.COMPLETED, value
    return job


def _launcher(loss):
    """Run each trial's loss(lr) at once; records the batches and the job index each started at."""
    calls = []

    def launch(overrides, first):
        calls.append((first, len(overrides)))
        lrs = [float(dict(o.split("=", 1) for o in ov)["optimizer.lr"]) for ov in overrides]
        return [_job(ov, loss(lr)) for ov, lr in zip(overrides, lrs)]

    return launch, calls


def _study(tmp_path, launch, **kw):
    space, fixed = search_space({"optimizer.lr": "tag(log, interval(1e-4, 1e-1))"}, ["train.max_steps=5"])
    settings = dict(direction="minimize", study_name="t", storage=None, n_trials=10, n_jobs=3, max_failure_rate=0.5)
    return run_study(launch, space=space, fixed=fixed, seed=0, sweep_dir=tmp_path, **(settings | kw))


def test_the_study_minimises_and_writes_its_results(tmp_path):
    launch, calls = _launcher(lambda lr: (math.log10(lr) + 2.5) ** 2)  # best at lr = 10**-2.5
    study = _study(tmp_path, launch)
    assert calls == [(0, 3), (3, 3), (6, 3), (9, 1)]  # n_jobs per batch, job indices running on
    result = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    values = [t.value for t in study.trials]
    assert result["best_value"] == min(values) and result["trials"] == 10 and result["failed"] == 0
    assert (math.log10(result["best_params"]["optimizer.lr"]) + 2.5) ** 2 == pytest.approx(result["best_value"])


def test_a_diverged_or_crashed_trial_is_failed_never_a_number(tmp_path):
    """NaN / inf returns and exceptions are FAIL trials: never the best value, counted in `failed`."""
    outcomes = iter([math.nan, 3.0, RuntimeError("boom"), 2.0, math.inf, 1.0])
    launch, _ = _launcher(lambda lr: next(outcomes))
    study = _study(tmp_path, launch, n_trials=6, max_failure_rate=0.7)  # 2 of 3, then 3 of 6 failed
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.FAIL) == 3
    result = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert result["best_value"] == 1.0 and result["failed"] == 3


def test_a_trial_stopped_before_its_end_is_failed_not_scored_mid_run(tmp_path):
    """A trial preempted where the signal's own handler returns (submitit's local SIGTERM bypass) used to hand the
    sweeper its mid-run val loss, scored as COMPLETE beside finished trials. gptlab-train's result for a sweeper
    is the final val loss of a finished run only (cli/train.py sweeper_value)."""
    from gptlab.cli.train import sweeper_value

    finished = {"status": "finished", "final_val_loss": 2.0}
    stopped = {"status": "preempted", "final_val_loss": 1.5}  # an early eval of a run that would have gone on
    assert sweeper_value(finished) == 2.0
    assert sweeper_value(stopped) is None and sweeper_value({"status": "pruned", "final_val_loss": None}) is None
    outcomes = iter([sweeper_value(s) for s in (finished, stopped, finished)])
    launch, _ = _launcher(lambda lr: next(outcomes))
    study = _study(tmp_path, launch, n_trials=3, max_failure_rate=0.5)
    assert [t.state for t in study.trials].count(optuna.trial.TrialState.FAIL) == 1
    assert yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())["best_value"] == 2.0


def test_more_failures_than_allowed_stop_the_study_in_one_line(tmp_path):
    launch, _ = _launcher(lambda lr: math.nan)
    with pytest.raises(
        ConfigError, match=r"^tune: 3 of 3 trials failed, more than hydra.sweeper.max_failure_rate=0.5$"
    ):
        _study(tmp_path, launch, max_failure_rate=0.5)
    assert not (tmp_path / "optimization_results.yaml").exists()


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"direction": "down"}, r"^hydra.sweeper.direction: 'down' is not allowed; allowed: minimize, maximize$"),
        ({"n_trials": 0}, r"^hydra.sweeper: n_trials=0 and n_jobs=3 must be >= 1$"),
        ({"max_failure_rate": 2.0}, r"^hydra.sweeper.max_failure_rate=2.0: must be in \[0, 1\]$"),
    ],
)
def test_bad_sweeper_settings_are_one_line(tmp_path, kw, message):
    launch, calls = _launcher(lambda lr: 1.0)
    with pytest.raises(ConfigError, match=message):
        _study(tmp_path, launch, **kw)
    assert calls == []
