"""gptlab-train: one training run (or a Hydra multirun sweep) composed from the config groups in conf/."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from gptlab.build import group_choices
from gptlab.cli import fail
from gptlab.errors import ConfigError
from gptlab.loop import TrainingDiverged
from gptlab.paths import CONF_DIR
from gptlab.placement import place_local_job, remember_launch_gpus

log = logging.getLogger("gptlab")
remember_launch_gpus()


def _report(summary: dict, run_dir: Path) -> None:
    """The end-of-run table a new user reads: losses, speed, where the files are."""
    def fmt(v, spec):
        return "n/a" if v is None else format(v, spec)
    lines = [
        "",
        f"run finished: {summary['status']} after {summary['steps']} steps ({summary['tokens']:,} tokens, {summary['wall_s']:.0f}s)",
        f"  val loss       final {fmt(summary['final_val_loss'], '.4f')}   best {fmt(summary['best_val_loss'], '.4f')}",
        f"  speed          {fmt(summary['tokens_per_s_median'], ',.0f')} tokens/s   {fmt(summary['step_ms_median'], '.1f')} ms/step   MFU {fmt(summary['mfu_median'] and 100 * summary['mfu_median'], '.1f')}%",
        f"  model          {summary['params']:,} params   {summary['flops_per_token']:.3g} FLOPs/token (train)",
        f"  peak memory    {summary['peak_mem_bytes'] / 2**20:,.0f} MiB",
        f"  run dir        {run_dir}  (metrics.jsonl, summary.json, provenance.json, checkpoints/)",
    ]
    if summary.get("wandb_sync"):
        lines.append(f"  W&B (offline)  upload later with: {summary['wandb_sync']}")
    if summary.get("sample"):
        lines += ["", "sample from the final model:", "-" * 60, summary["sample"], "-" * 60]
    print("\n".join(lines), flush=True)


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base=None)
def main(cfg: DictConfig) -> float | None:
    """Train one configuration; returns the final val loss (the objective for Hydra sweepers)."""
    from gptlab.run import execute

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    overrides = list(hc.overrides.task)
    multirun = hc.mode == RunMode.MULTIRUN
    if multirun and os.environ.get("SUBMITIT_EXECUTOR") == "local":  # launcher=local: own cores and GPUs
        place_local_job(hc.job.num, hc.launcher.get("cpus_per_task"), hc.launcher.get("gpus_per_node"))
    try:
        summary = execute(cfg, run_dir, group_choices(cfg), overrides)
    except (ConfigError, TrainingDiverged) as err:
        if multirun:
            raise  # the launcher reports it with the job's log and goes on with the other runs
        fail(err)
    _report(summary, run_dir)
    if summary["status"] == "preempted" and os.environ.get("SLURM_JOB_ID"):
        # SLURM requeues this job: exit without a result so submitit (and the sweep) wait for the next attempt
        raise SystemExit(143)
    return summary["final_val_loss"]


if __name__ == "__main__":
    sys.exit(main())
