"""Pruned tune trials: each trial's run reports its val loss at every eval to its Optuna trial, and stops there when
the study's pruner (`hydra.sweeper.pruner`) says the curve is hopeless; the run records itself as pruned.

The sweeper (gptlab/sweep/tune.py) asks and tells trials in its own process; a trial's run lives in the same process
(Hydra's basic launcher) or its own (launcher=local, slurm), so both open one storage: hydra.sweeper.storage, else a
journal file in the sweep dir (optuna.journal: many processes, no server, a shared filesystem for SLURM). The sweeper
names each job's trial with `+hydra.sweeper.trial=N` (a Hydra override: the run's own config is untouched); the run
reports to trial N and, when pruned, tells the study so itself (TrialState.PRUNED, with the step). Optuna is imported
only here and only when a pruner is configured.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from gptlab.errors import ConfigError

log = logging.getLogger(__name__)

KEY = "hydra.sweeper.pruner"
JOURNAL = "optuna.journal"  # the study's storage in the sweep dir when hydra.sweeper.storage is null
DEFAULT_STUDY = "gptlab-tune"  # the study's name in that fresh journal when hydra.sweeper.study_name is null


def _pruner_classes() -> dict[str, type]:
    """optuna.pruners.<Name> -> class, for every pruner Optuna ships (the allowed targets)."""
    import optuna

    return {
        f"optuna.pruners.{name}": cls
        for name, cls in vars(optuna.pruners).items()
        if isinstance(cls, type) and issubclass(cls, optuna.pruners.BasePruner) and cls is not optuna.pruners.BasePruner
    }


def make_pruner(node: Mapping | None):
    """`hydra.sweeper.pruner` (a node with `_target_: optuna.pruners.<Name>` and its kwargs) -> the pruner, None for
    null; an unknown target or bad kwargs is a one-line ConfigError naming the key."""
    if node is None:
        return None
    from hydra.utils import instantiate

    classes = _pruner_classes()
    allowed = ", ".join(sorted(classes))
    target = node.get("_target_") if isinstance(node, Mapping) else None
    if not isinstance(target, str):
        raise ConfigError(
            f"{KEY}: give a node with _target_: one of {allowed} (and its arguments), or null; got {node!r}"
        )
    module, _, name = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):  # a typo: no such module or name
        cls = None
    if cls not in classes.values():
        raise ConfigError(f"{KEY}._target_: {target!r} is not an Optuna pruner; allowed: {allowed}")
    params = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
    for key in node:
        if not str(key).startswith("_") and key not in params:
            raise ConfigError(f"{KEY}.{key}: not an argument of {cls.__name__}; allowed: {', '.join(params)}")
    try:
        _probe(instantiate(dict(node)))  # a throwaway instance: pruners keep state per study
        return instantiate(dict(node))
    except Exception as err:  # noqa: BLE001 - the pruner's own check of its values (ValueError, TypeError, ...)
        cause = err.__cause__ or err
        said = str(cause) if isinstance(cause, (ValueError, TypeError)) else f"{type(cause).__name__}: {cause}"
        raise ConfigError(
            f"{KEY}: {cls.__name__} refused its arguments: {' '.join(said.split())[:300]}; allowed: arguments it can "
            "use (its defaults do; it is tried on a throwaway study before any trial)"
        ) from None


def _probe(pruner) -> None:
    """Use `pruner` as a study would, on a throwaway in-memory one (three trials reporting eight steps each), so a
    value its class accepts but fails on at use (HyperbandPruner(reduction_factor=1): a division by zero at the
    first report) is refused before any trial runs, not in every trial's run."""
    import warnings

    import optuna

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ExperimentalWarning of the newer pruners
            study = optuna.create_study(pruner=pruner, sampler=optuna.samplers.RandomSampler(seed=0))
            for number in range(3):
                trial = study.ask()
                for step in range(1, 9):
                    trial.report(1.0 + number / step, step)
                    trial.should_prune()
                study.tell(trial, 1.0 + number)
    finally:
        optuna.logging.set_verbosity(verbosity)


def address(study_name: str | None, storage: str | None, sweep_dir: str | Path) -> tuple[str, str]:
    """(study name, storage) a pruned search and its runs share: the given ones, else DEFAULT_STUDY in the sweep
    dir's journal file. A named storage with no study name is refused (Optuna would invent a name the runs cannot
    know)."""
    if storage is not None and study_name is None:
        raise ConfigError(
            "hydra.sweeper.study_name: null with hydra.sweeper.storage and a pruner; name the study (each trial's "
            "run finds it by name), e.g. hydra.sweeper.study_name=tune-lr"
        )
    return study_name or DEFAULT_STUDY, storage or str(Path(sweep_dir) / JOURNAL)


def open_storage(spec: str):
    """An Optuna storage from its text: a database URL (sqlite:///study.db) as it is, any other text a journal
    file (optuna.storages.JournalStorage over a JournalFileBackend)."""
    if "://" in spec:
        return spec
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    Path(spec).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(spec))


class TrialReport:
    """One run's Optuna trial: `at_eval` reports each val loss and answers whether the pruner stops the run there.

    Opened on first use (a run that never evaluates never touches the storage); rank 0 alone calls it."""

    def __init__(self, storage: str, study_name: str, number: int, pruner: Mapping):
        self.storage, self.study_name, self.number, self.pruner = storage, study_name, number, dict(pruner)
        self._study: Any = None
        self._trial: Any = None

    def _open(self):
        import optuna

        if self._trial is None:
            storage = optuna.storages.get_storage(open_storage(self.storage))
            study = optuna.load_study(study_name=self.study_name, storage=storage, pruner=make_pruner(self.pruner))
            study_id = storage.get_study_id_from_name(self.study_name)
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, self.number)
            self._study, self._trial = study, optuna.trial.Trial(study, trial_id)
        return self._trial

    def at_eval(self, step: int, val_loss: float, last: bool) -> bool:
        """Report `val_loss` at `step`; True when the pruner stops the run here (the trial is then told PRUNED).
        The last step's eval is reported, never pruned: that run finished, and its loss is the trial's value."""
        import optuna

        trial = self._open()
        trial.report(val_loss, step)  # NaN too: Optuna's pruners prune a NaN
        if last or not trial.should_prune():
            return False
        self._study.tell(self.number, state=optuna.trial.TrialState.PRUNED)
        log.info("tune trial %d pruned at step %d (val loss %.4g): the run stops here", self.number, step, val_loss)
        return True


def tune_trial(hydra_cfg) -> TrialReport | None:
    """The trial a tune job reports to: its Hydra config's `hydra.sweeper.trial` (set on each job by the gptlab
    sweeper when `hydra.sweeper.pruner` is set), else None (no pruning; nothing imported)."""
    from omegaconf import OmegaConf

    number = OmegaConf.select(hydra_cfg, "sweeper.trial", default=None)
    node = OmegaConf.select(hydra_cfg, "sweeper.pruner", default=None)
    if number is None or node is None:
        return None
    name, storage = address(
        OmegaConf.select(hydra_cfg, "sweeper.study_name", default=None),
        OmegaConf.select(hydra_cfg, "sweeper.storage", default=None),
        str(hydra_cfg.sweep.dir),
    )
    pruner = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    return TrialReport(storage, name, int(number), cast(Mapping, pruner))
