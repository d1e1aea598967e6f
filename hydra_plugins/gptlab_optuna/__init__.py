"""gptlab's Optuna sweeper for Hydra (`hydra/sweeper=gptlab_optuna`, used by `+tune=...`): Hydra finds sweepers
only in the `hydra_plugins` namespace, so this module holds the class Hydra instantiates and nothing else; the
search itself is gptlab/sweep/tune.py. Config: conf/hydra/sweeper/gptlab_optuna.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf


class GptlabOptunaSweeper(Sweeper):
    """Optuna TPE over Hydra overrides; each batch of `n_jobs` trials goes through the configured launcher; with a
    `pruner` each trial's run may stop early as pruned."""

    def __init__(
        self,
        direction: str = "minimize",
        study_name: str | None = None,
        storage: str | None = None,
        n_trials: int = 12,
        n_jobs: int = 1,
        max_failure_rate: float = 0.0,
        seed: int | None = None,
        params: dict | None = None,
        pruner: dict | None = None,
    ):
        self.settings: dict[str, Any] = dict(
            direction=direction,
            study_name=study_name,
            storage=storage,
            n_trials=n_trials,
            n_jobs=n_jobs,
            max_failure_rate=max_failure_rate,
            seed=seed,
            # a node that gptlab.sweep.prune builds (the yaml's _recursive_: false keeps Hydra from building it first)
            pruner=OmegaConf.to_container(pruner, resolve=True) if isinstance(pruner, DictConfig) else pruner,
        )
        self.params = OmegaConf.to_container(params) if isinstance(params, DictConfig) else dict(params or {})

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.hydra_context, self.config = hydra_context, config  # validate_batch_is_legal composes with them
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> None:
        from gptlab.sweep.tune import run_study, search_space

        space, fixed = search_space(self.params, arguments)

        def launch(overrides: list[list[str]], first: int) -> list:
            self.validate_batch_is_legal(overrides)
            return list(self.launcher.launch(overrides, initial_job_idx=first))

        run_study(launch, space=space, fixed=fixed, sweep_dir=Path(self.config.hydra.sweep.dir), **self.settings)
