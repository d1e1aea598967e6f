"""Bayesian search with Optuna (TPE) over Hydra overrides: `gptlab-train -m +tune=lr`.

The Hydra side (hydra_plugins/gptlab_optuna: the sweeper Hydra instantiates) only wires this module to the launcher.
Here: the search space from Hydra's sweep syntax, the ask/launch/tell loop, and the results file. A trial that
failed or returned a non-finite loss (a diverged run) is told to Optuna as failed, never as a number; more failures
than `max_failure_rate` allows stop the study in one line. With `hydra.sweeper.pruner` each trial's run reports its
val loss at every eval and may be stopped there as pruned (gptlab/sweep/prune.py): a pruned trial counts as neither
a result nor a failure.

    interval(a, b)            float in [a, b]
    tag(log, interval(a, b))  the same, sampled on a log scale
    choice(x, y, ...)         categorical
    range(a, b[, step])       int in [a, b) by step (the way to search an int: batch size, layers)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from gptlab.errors import ConfigError
from gptlab.util.extras import require

log = logging.getLogger(__name__)


def _optuna():
    require("optuna", "optuna", "hydra/sweeper=gptlab_optuna (+tune=...)")
    import optuna

    return optuna


def distribution(override):
    """One parsed Hydra sweep override -> an Optuna distribution; a one-line error for any other syntax."""
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    optuna = _optuna()
    key, value = override.get_key_element(), override.value()
    if isinstance(value, IntervalSweep):
        log_scale = "log" in value.tags  # Hydra reads interval bounds as floats: ints are range()'s
        low, high = float(value.start), float(value.end)
        shown = f"{'tag(log, ' if log_scale else ''}interval({low:g}, {high:g}){')' if log_scale else ''}"
        if not (math.isfinite(low) and math.isfinite(high)) or low > high:
            raise ConfigError(
                f"{key}: {shown} in a tune search: give finite bounds low to high, interval(a, b), a <= b"
            )
        if log_scale and low <= 0:
            raise ConfigError(f"{key}: {shown} in a tune search: a log-scale interval needs both bounds > 0")
        return optuna.distributions.FloatDistribution(low, high, log=log_scale)
    if isinstance(value, RangeSweep):
        step = int(value.step or 1)
        if not all(isinstance(v, int) for v in (value.start, value.stop, step)) or step <= 0:
            raise ConfigError(f"{key}: range() in a tune search takes ints with a positive step; got {value}")
        start, stop = int(value.start), int(value.stop)
        if stop <= start:
            raise ConfigError(f"{key}: range({start}, {stop}) in a tune search is empty")
        last = start + (stop - 1 - start) // step * step  # range()'s last value: stop is excluded
        return optuna.distributions.IntDistribution(start, last, step=step)
    if isinstance(value, ChoiceSweep):
        return optuna.distributions.CategoricalDistribution(list(value.list))
    raise ConfigError(
        f"{key}: a tune search dimension must be interval(a,b), tag(log,interval(a,b)), choice(...) or range(...); "
        f"got '{override.input_line}'"
    )


def _flat(params: Mapping, prefix: str = "") -> Iterator[tuple[str, str]]:
    """{"optimizer": {"lr": ...}} and {"optimizer.lr": ...} alike -> ("optimizer.lr", ...)."""
    for key, value in params.items():
        if isinstance(value, Mapping):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def search_space(params: Mapping, arguments: Sequence[str]) -> tuple[dict, list[str]]:
    """The study's dimensions (hydra.sweeper.params plus any sweep syntax on the command line) and the fixed
    overrides every trial gets."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    space = {key: distribution(parser.parse_override(f"{key}={value}")) for key, value in _flat(params or {})}
    fixed: list[str] = []
    for override, text in zip(parser.parse_overrides(list(arguments)), arguments):
        if override.is_sweep_override():
            space[override.get_key_element()] = distribution(override)
        else:
            fixed.append(text)  # as given: Hydra composes each trial from the same text
    if not space:
        raise ConfigError(
            "hydra.sweeper.params: nothing to search; give e.g. optimizer.lr: tag(log, interval(1e-4, 1e-2))"
        )
    return space, fixed


def objective(job_return) -> float | None:
    """The trial's value, or None for a failed trial (an exception, no return value, or a non-finite loss)."""
    try:
        value = job_return.return_value  # re-raises the run's exception
    except Exception as err:  # noqa: BLE001 - any failure of a run is a failed trial, recorded with its reason
        log.warning("trial %s failed: %s", job_return.overrides, " ".join(str(err).split())[:200])
        return None
    if value is None or not math.isfinite(float(value)):
        log.warning("trial %s returned %s: recorded as failed", job_return.overrides, value)
        return None
    return float(value)


def run_study(
    launch: Callable[[list[list[str]], int], list],
    *,
    space: dict,
    fixed: list[str],
    direction: str,
    study_name: str,
    storage: str | None,
    n_trials: int,
    n_jobs: int,
    max_failure_rate: float,
    seed: int | None,
    sweep_dir: Path,
    pruner: Mapping | None = None,
):
    """Ask `n_jobs` trials at a time, launch them (launch(overrides per trial, first job index) -> job returns),
    tell Optuna their objective; write <sweep_dir>/optimization_results.yaml. Returns the study.

    With a `pruner` node the study lives where the trials' runs reach it (prune.address) and each job gets
    `+hydra.sweeper.trial=<number>`; a trial its run told Optuna it pruned stays PRUNED, whatever the job returned."""
    _check_settings(direction, n_trials, n_jobs, max_failure_rate)
    study, pruning = _open_study(study_name, storage, sweep_dir, direction=direction, seed=seed, pruner=pruner)
    done = failed = 0
    asked: list[int] = []
    while done < n_trials:
        trials = [study.ask(space) for _ in range(min(n_jobs, n_trials - done))]
        asked += [t.number for t in trials]
        overrides = [
            [*fixed, *(f"{k}={t.params[k]}" for k in space), *([f"+hydra.sweeper.trial={t.number}"] if pruning else [])]
            for t in trials
        ]
        failed += _tell(study, trials, launch(overrides, done))
        done += len(trials)
        if failed / done > max_failure_rate:
            raise ConfigError(
                f"tune: {failed} of {done} trials failed, more than hydra.sweeper.max_failure_rate={max_failure_rate}"
            )
    return _write_results(study, direction, asked, failed, sweep_dir)


def _check_settings(direction: str, n_trials: int, n_jobs: int, max_failure_rate: float) -> None:
    """The sweeper's own keys in range, else a one-line ConfigError naming the key and the allowed values."""
    if direction not in ("minimize", "maximize"):
        raise ConfigError(f"hydra.sweeper.direction: {direction!r} is not allowed; allowed: minimize, maximize")
    if n_trials < 1 or n_jobs < 1:
        raise ConfigError(f"hydra.sweeper: n_trials={n_trials} and n_jobs={n_jobs} must be >= 1")
    if not 0.0 <= max_failure_rate <= 1.0:
        raise ConfigError(f"hydra.sweeper.max_failure_rate={max_failure_rate}: must be in [0, 1]")


def _open_study(study_name: str, storage: str | None, sweep_dir: Path, *, direction: str, seed: int | None, pruner):
    """The Optuna study (TPE sampler) -> (study, whether its trials' runs prune); a pruning study moves to where the
    runs reach it."""
    optuna = _optuna()
    from gptlab.sweep import prune

    pruning = prune.make_pruner(pruner)
    if pruning is not None:
        study_name, storage = prune.address(study_name, storage, sweep_dir)
    study = optuna.create_study(
        study_name=study_name,
        storage=prune.open_storage(storage) if storage is not None else None,
        sampler=optuna.samplers.TPESampler(seed=seed),
        pruner=pruning or optuna.pruners.NopPruner(),  # the runs prune; the study's own pruner steers TPE's brackets
        direction=direction,
        load_if_exists=storage is not None,
    )
    return study, pruning is not None


def _tell(study, trials: list, returns: list) -> int:
    """Tell Optuna each launched trial's objective (a failure as FAIL; one its run pruned is left PRUNED) -> the
    number that failed."""
    optuna = _optuna()
    told = {t.number: t.state for t in study.get_trials(deepcopy=False)}  # the runs' own PRUNED
    failed = 0
    for trial, job_return in zip(trials, returns):
        if told.get(trial.number) == optuna.trial.TrialState.PRUNED:
            continue
        value = objective(job_return)
        if value is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            failed += 1
        else:
            study.tell(trial, value)
    return failed


def _write_results(study, direction: str, asked: list[int], failed: int, sweep_dir: Path):
    """<sweep_dir>/optimization_results.yaml: the best of the study's COMPLETE trials, this sweep's counts and each
    trial of it that was pruned, with the step it stopped at (never a value); returns the study."""
    optuna = _optuna()
    import yaml

    trials, done = study.get_trials(deepcopy=False), len(asked)
    finished = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    pruned = [t for t in trials if t.state == optuna.trial.TrialState.PRUNED and t.number in set(asked)]
    if not finished:
        raise ConfigError(
            f"tune: none of the {done} trials finished ({len(pruned)} pruned, {failed} failed); nothing to report"
        )
    results = {
        "name": "optuna",
        "direction": direction,
        "best_params": study.best_params,
        "best_value": study.best_value,
        "trials": done,
        "failed": failed,
        "pruned": len(pruned),
        "pruned_trials": [{"number": t.number, "params": t.params, "step": t.last_step} for t in pruned],
        "optuna": optuna.__version__,
    }
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / "optimization_results.yaml").write_text(yaml.safe_dump(results, sort_keys=False))
    log.info(
        "best of %d trials (%d pruned, %d failed): %s = %s",
        done,
        len(pruned),
        failed,
        results["best_params"],
        results["best_value"],
    )
    return study
