"""Tune searches fail loudly and keep their records:

- a pruner argument its class accepts but fails on at use (HyperbandPruner(reduction_factor=1): a division by zero at
  the first report) failed every trial's run and the study went on; it is refused in one line before any trial;
- a pruned trial is terminal: its run dir started again (same config) re-reports "pruned" untouched instead of
  training over it, and another config into it is refused, its files byte-identical.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gptlab.config.build import compose, group_choices
from gptlab.errors import ConfigError
from gptlab.sweep.prune import make_pruner
from gptlab.sweep.tune import run_study, search_space
from gptlab.train.run import execute
from helpers.train import FAST

HYPERBAND = st.fixed_dictionaries(
    {"_target_": st.just("optuna.pruners.HyperbandPruner")},
    optional={
        "min_resource": st.sampled_from([0, 1, 2, "auto"]),
        "max_resource": st.sampled_from([0, 1, 8, "auto"]),
        "reduction_factor": st.sampled_from([1, 2, 3]),
        "bootstrap_count": st.sampled_from([-1, 0, 1]),
    },
)
MEDIAN = st.fixed_dictionaries(
    {"_target_": st.just("optuna.pruners.MedianPruner")},
    optional={"n_startup_trials": st.sampled_from([-1, 0, 2]), "n_warmup_steps": st.sampled_from([-1, 0, 3])},
)


def _use(pruner, trials: int = 5, steps: int = 12) -> None:
    """A study's use of the pruner, with more trials and steps than any probe."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(pruner=pruner, sampler=optuna.samplers.RandomSampler(seed=1))
    for number in range(trials):
        trial = study.ask()
        for step in range(1, steps + 1):
            trial.report(2.0 + number - step / steps, step)
            if trial.should_prune():
                break
        study.tell(trial, 1.0 + number)


@settings(max_examples=40, deadline=None)
@given(node=HYPERBAND | MEDIAN)
def test_a_pruner_is_refused_up_front_or_works_in_a_study(node):
    try:
        pruner = make_pruner(node)
    except ConfigError as err:
        assert str(err).startswith("hydra.sweeper.pruner: ") and "\n" not in str(err)
        return
    _use(pruner)  # accepted: it must then work


def test_a_study_with_a_pruner_that_fails_at_use_launches_nothing(tmp_path):
    launched = []

    def launch(overrides, first):
        launched.append(overrides)
        raise AssertionError("no trial may be launched with a pruner that cannot work")

    space, fixed = search_space({"optimizer.lr": "choice(0.003, 1e-6)"}, ["train.max_steps=8"])
    with pytest.raises(ConfigError, match=r"^hydra\.sweeper\.pruner: HyperbandPruner refused its arguments: "):
        run_study(launch, space=space, fixed=fixed, direction="minimize", study_name="s", storage=None, n_trials=2,
                  n_jobs=1, max_failure_rate=1.0, seed=0, sweep_dir=tmp_path,
                  pruner={"_target_": "optuna.pruners.HyperbandPruner", "reduction_factor": 1})  # fmt: skip
    assert launched == [] and not any(tmp_path.iterdir())


class _PruneAt:
    """A tune trial stand-in whose pruner stops the run at `step`."""

    def __init__(self, step: int | None):
        self.step = step

    def at_eval(self, step, val_loss, last):
        return step == self.step


def _snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


@pytest.mark.parametrize("ckpt_interval", [2, 250], ids=["with-checkpoints", "without"])
def test_a_pruned_trial_started_again_keeps_its_record(tmp_path, ckpt_interval):
    args = [*FAST, "train.max_steps=8", "train.eval_interval=2", f"train.ckpt_interval={ckpt_interval}",
            "model.n_layer=1", "model.d_model=32", "schedule=constant", "schedule.warmup_steps=0"]  # fmt: skip
    cfg = compose(args)
    run = tmp_path / "run"
    run.mkdir()
    first = execute(cfg, run, group_choices(cfg), args, trial=_PruneAt(6))
    assert first["status"] == "pruned" and first["pruned_at_step"] == 6
    kept = _snapshot(run)
    for trial in (_PruneAt(None), None):  # the same trial relaunched (its pruner says go on), or started by hand
        again = execute(compose(args), run, group_choices(cfg), args, trial=trial)
        assert again["status"] == "pruned" and again["pruned_at_step"] == 6 and again["steps"] == first["steps"]
        assert _snapshot(run) == kept
    other = [*args, "optimizer.lr=0.01"]  # a new trial's config in its dir: refused (by its checkpoint, if any)
    with pytest.raises(ConfigError, match=r"(holds a tune trial pruned at step 6 under another|another) config.*lr"):
        execute(compose(other), run, group_choices(compose(other)), other, trial=_PruneAt(None))
    assert _snapshot(run) == kept
