"""gptlab-train: one training run (or a Hydra multirun sweep) composed from the config groups in conf/.

Every user mistake ends in ONE line on stderr, `error: ...`, and a non-zero exit: 2 for bad input
(a config key, choice or value, data, a checkpoint, a run dir in use), 1 when the run itself fails
(the loss diverged, an I/O error such as a full disk). A run refused for bad input puts back the
.hydra/ files Hydra rewrote in an existing run dir. HYDRA_FULL_ERROR=1 shows full tracebacks instead.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import logging
import os
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gptlab.cli import fail, hydra_raises
from gptlab.cli.help import help_topic, render
from gptlab.config import resolvers  # noqa: F401  (hydra.run.dir / sweep.dir resolvers, before Hydra resolves them)
from gptlab.config.command_line import check_command_line
from gptlab.errors import ConfigError, TrainingDiverged
from gptlab.runtime.placement import launch_rank, place_local_job, remember_launch_gpus
from gptlab.sinks.progress import console_log
from gptlab.state.layout import HYDRA_WRITES, check_run_dir, check_run_path
from gptlab.state.lock import run_dir_lock
from gptlab.state.refused import HydraFiles, put_back, remove_refused, save_hydra_files
from gptlab.util.paths import CONF_DIR

log = logging.getLogger("gptlab")
remember_launch_gpus()
OS_HINTS: dict[int | None, str] = {  # keyed by OSError.errno, which may be None
    errno.ENOSPC: "free some disk space",
    errno.EDQUOT: "free some disk quota",
    errno.EFBIG: "the file size limit (ulimit -f) is too small",
    errno.EROFS: "choose a writable hydra.run.dir",
    errno.EACCES: "choose a writable hydra.run.dir",
    errno.EPERM: "choose a writable hydra.run.dir",
    errno.EEXIST: "hydra.run.dir must name a directory, not a file",
    errno.ENOTDIR: "hydra.run.dir must not be under a file",
}


def one_line(err: BaseException) -> str:
    """A user error as one line naming the key, file or override and what is allowed."""
    if isinstance(err, MissingConfigException) and err.options and err.missing_cfg_file:
        group, _, choice = err.missing_cfg_file.rpartition("/")
        near = difflib.get_close_matches(choice, err.options, n=1)
        hint = f" (did you mean {group}={near[0]}?)" if near else ""
        return f"{group}={choice}: no such option{hint}; available: {', '.join(err.options)}"
    if isinstance(err, OverrideParseException):
        text = f"cannot parse override '{err.override}': {str(err).splitlines()[0]}"
        value = str(err.override).partition("=")[2]
        if not value.isascii() and not value.startswith(("'", '"')):  # Hydra's lexer takes unquoted ASCII only
            key = str(err.override).partition("=")[0]
            text += f"; a value with non-ASCII characters needs quotes: {key}='{value}'"
        return text
    cause: Any = err.__cause__  # an OmegaConf key error when it has full_key
    if isinstance(err, ConfigCompositionException) and getattr(cause, "full_key", None):
        parent = cause.parent_node if OmegaConf.is_dict(cause.parent_node) else {}
        keys = [str(k) for k in parent if not str(k).startswith("_") and k != "hydra"]
        near = difflib.get_close_matches(str(cause.full_key).rpartition(".")[2], keys, n=1)
        prefix = str(cause.full_key).rpartition(".")[0]
        hint = f" (did you mean {prefix + '.' if prefix else ''}{near[0]}?)" if near else ""
        what = _chosen(prefix) or "no such key or group"
        return f"{cause.full_key}: {what}{hint}; allowed here: {', '.join(keys)}"
    if isinstance(err, OSError) and not isinstance(err, HydraException):
        where = f" '{err.filename}'" if err.filename else ""
        hint = OS_HINTS.get(err.errno, "check the path and the disk")
        return f"I/O error{where}: {err.strerror or err}; {hint}"
    return " ".join(str(err).split())[:500]


def _chosen(group: str) -> str:
    """`not a key of schedule=constant` when the command line chose the group's option (say whose keys these are)."""
    if not group or "." in group or not (CONF_DIR / group).is_dir():
        return ""
    picked = [a.split("=", 1)[1] for a in sys.argv[1:] if a.lstrip("+~").startswith(f"{group}=")]
    return f"not a key of {group}={picked[-1]}" if picked else ""


def run_errors() -> tuple[type[BaseException], ...]:
    """What a run raises for bad input or a failed run."""
    return ConfigError, TrainingDiverged, OSError, OmegaConfBaseException


def exit_code(err: BaseException) -> int:
    """1 when the run failed (diverged, I/O), 2 for bad input."""
    return 1 if isinstance(err, (TrainingDiverged, OSError)) and not isinstance(err, HydraException) else 2


def _writes_run_files(cfg: DictConfig) -> bool:
    """Rank 0 of a data-parallel job (or a single process) owns the run dir."""
    return not OmegaConf.select(cfg, "hardware.distributed", default=False) or _first_rank()


def _first_rank() -> bool:
    """A lone process, or rank 0 of a torchrun / SLURM job: it writes run files under any hardware profile."""
    return launch_rank() == 0


def _report(summary: dict, run_dir: Path) -> None:
    """The end-of-run table a new user reads: losses, speed, where the files are."""

    def fmt(v, spec):
        return "n/a" if v is None else format(v, spec)

    lines = [
        "",
        f"run finished: {summary['status']} after {summary['steps']} steps ({summary['tokens']:,} tokens, {summary['wall_s']:.0f}s)",
        f"  val loss       final {fmt(summary['final_val_loss'], '.4f')}   best {fmt(summary['best_val_loss'], '.4f')}",
        f"  speed          {fmt(summary['tokens_per_s_median'], ',.0f')} tokens/s   {fmt(summary['step_ms_median'], '.1f')} ms/step (data wait {fmt(summary.get('data_ms_median'), '.1f')} ms)   MFU {fmt(summary['mfu_median'] and 100 * summary['mfu_median'], '.1f')}%   warm-up +{fmt(summary.get('warmup_s'), '.1f')}s",
        f"  model          {summary['params']:,} params   {summary['flops_per_token']:.3g} FLOPs/token (train)",
        f"  peak memory    {summary['peak_mem_bytes'] / 2**20:,.0f} MiB",
        f"  run dir        {run_dir}  (metrics.jsonl, summary.json, provenance.json, checkpoints/)",
    ]
    if summary.get("val_sets"):  # data.val_sets: each set's final loss, beside the pooled one
        sets = "   ".join(f"{name} {fmt(s.get('final_loss'), '.4f')}" for name, s in summary["val_sets"].items())
        lines.insert(3, f"  val sets       {sets}")
    if summary.get("pruned_at_step") is not None:
        lines.insert(
            2, f"  pruned         at step {summary['pruned_at_step']} by hydra.sweeper.pruner: no final val loss"
        )
    if summary.get("wandb_sync"):
        lines.append(f"  W&B (offline)  upload later with: {summary['wandb_sync']}")
    if summary.get("sample"):
        lines += ["", "sample from the final model:", "-" * 60, summary["sample"], "-" * 60]
    print("\n".join(lines), flush=True)
    console_log.info("\n".join(lines).strip("\n"))


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base=None)
def train_app(cfg: DictConfig) -> float | None:
    """Train one configuration; returns its final val loss when it finished (the objective for Hydra sweepers)."""
    from gptlab.config.build import group_choices
    from gptlab.sweep.prune import tune_trial
    from gptlab.train.run import execute
    from gptlab.train.signals import StopFlag

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    if not multirun:
        _STARTED["run_dir"] = run_dir
    if multirun and os.environ.get("SUBMITIT_EXECUTOR") == "local":  # launcher=local: own cores and GPUs
        place_local_job(hc.job.num, hc.launcher.get("cpus_per_task"), hc.launcher.get("gpus_per_node"))
    stop = StopFlag()  # SIGTERM/SIGUSR1/SIGUSR2/Ctrl-C: finish the step, checkpoint, then hand the signal on
    try:
        trial = tune_trial(hc) if multirun else None  # a pruning tune sweep's job: its Optuna trial
        check_run_path(run_dir)  # a dir given with an interpolation, or a multirun job's: never inside another run
        if not multirun:
            check_run_dir(run_dir, ignore=HYDRA_WRITES)
        with run_dir_lock(run_dir) if _writes_run_files(cfg) else contextlib.nullcontext():
            summary = execute(cfg, run_dir, group_choices(cfg), list(hc.overrides.task), stop=stop, trial=trial)
    except run_errors() as err:
        stop.restore()
        if multirun:
            raise  # the launcher reports it with the job's log and goes on with the other runs
        fail(one_line(err), exit_code(err))
    if summary["status"] == "interrupted":
        stop.restore()
        message = (
            f"interrupted (Ctrl-C) at step {summary['steps']}: checkpoint written; run the same command "
            f"to resume ({run_dir})"
        )
        print(message, file=sys.stderr, flush=True)
        console_log.warning(message)
        raise SystemExit(130)
    _report(summary, run_dir)
    if summary["status"] != "preempted":
        stop.restore()
        return sweeper_value(summary)
    stop.forward()  # submitit's SIGUSR2 handler requeues the job and exits here
    if os.environ.get("SLURM_JOB_ID"):
        # SLURM requeues this job: exit without a result so submitit (and the sweep) wait for the next attempt
        raise SystemExit(143)
    return sweeper_value(summary)  # a handler that returned (submitit's SIGTERM bypass): still no result


def sweeper_value(summary: dict) -> float | None:
    """What a Hydra sweeper reads as the run's result: its final val loss when it finished; None when it stopped
    before its end (preempted: its last val loss is a mid-run one, and a tune trial scored on it would compete
    with finished ones), and for a pruned run (no final val loss)."""
    return summary["final_val_loss"] if summary["status"] == "finished" else None


_STARTED: dict[str, Path] = {}  # the run dir of this process's single run (a refused run leaves no folder behind)


def explicit_run_dir(args: list[str]) -> Path | None:
    """The run dir a single run was pointed at with hydra.run.dir=..., when it is known before Hydra starts (quoted
    values unquoted as Hydra reads them; an interpolation or an override Hydra cannot parse: None)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if "-m" in args or "--multirun" in args:
        return None
    given = [a for a in args if a.lstrip("+").startswith("hydra.run.dir=")]
    if not given:
        return None
    try:
        value = OverridesParser.create().parse_override(given[-1]).value()
    except HydraException:
        return None  # Hydra's own one-line error follows
    return Path(value) if isinstance(value, str) and "${" not in value else None


def _page(text: str) -> None:
    """Print a help page; a reader that stops early (`| head`) is no error."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes


def _exit_rank() -> None:
    """A rank of a finished torchrun job exits here, without interpreter shutdown: on this torch a rank sometimes
    aborts while shutting down after its gloo group is destroyed ("terminate called without an active exception",
    SIGABRT in about 1 of 4 runs of tests/helpers/ddp_worker.py), and torchrun then reports a finished run as failed. Logs
    and streams are flushed first; every run file is already closed by then."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def main() -> None:
    """The gptlab-train command: Hydra's own errors (unknown key or choice, bad override) are one line too."""
    topic = help_topic(sys.argv[1:])
    try:
        if topic is not None:
            return _page(render(topic))
        check_command_line(sys.argv[1:])
    except ConfigError as err:
        fail(one_line(err), 2)
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return train_app()
    explicit, held = explicit_run_dir(sys.argv[1:]), contextlib.ExitStack()
    try:  # before Hydra writes .hydra/ and train.log: not into someone's folder, not inside another run, and the
        # dir's lock taken first, so a twin started at the same moment is refused before it writes (or removes) a thing
        if explicit:
            explicit = check_run_path(explicit)
            check_run_dir(explicit)
            if _first_rank():
                held.enter_context(run_dir_lock(explicit))
    except run_errors() as err:
        fail(one_line(err), exit_code(err))
    with held:
        _train(save_hydra_files(explicit), explicit)


def _train(saved: HydraFiles | None, explicit: Path | None) -> None:
    """Run train_app; a run refused for bad input leaves its dir as it was (gptlab/state/refused.py)."""
    try:
        with hydra_raises():
            train_app()
        _exit_rank()
    except KeyboardInterrupt:
        fail("interrupted (Ctrl-C); run the same command to resume from the newest checkpoint", 130)
    except SystemExit as stop:
        if stop.code == 2:
            put_back(saved) if saved is not None else remove_refused(_STARTED.get("run_dir") or explicit)
        raise
    except (HydraException, *run_errors()) as err:  # type: ignore[misc]  # mypy cannot type a starred tuple of exception types
        if exit_code(err) == 2:
            put_back(saved) if saved is not None else remove_refused(_STARTED.get("run_dir") or explicit)
        fail(one_line(err), exit_code(err))


if __name__ == "__main__":
    main()
