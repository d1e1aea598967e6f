"""Optional W&B logging of a comparison (table + plots) as a job_type="comparison" run; never fatal."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gptlab.compare.analysis import Comparison
from gptlab.compare.group import flatten
from gptlab.compare.runs import Run

TABLE_COLUMNS = ["label", "n_seeds", "val_loss_mean", "val_loss_std", "delta_val_loss", "significant", "p_value",
                 "tokens_per_s", "tokens_per_s_std", "step_ms", "step_ms_std", "mfu", "peak_mem_bytes", "speedup",
                 "speedup_p", "speed_verdict", "outside_load", "under_load", "model_fingerprint", "identical_to", "params",
                 "flops_per_token"]
_SWEEP_CONTAINERS = {"sweeps", "multirun", "outputs", "runs"}


def wanted(flag: bool | None) -> bool:
    """--wandb/--no-wandb win; otherwise log when WANDB_MODE is set to anything but "disabled"."""
    if flag is not None:
        return flag
    mode = os.environ.get("WANDB_MODE", "")
    return bool(mode) and mode != "disabled"


def _common(runs: list[Run], keys: tuple[str, ...]) -> str | None:
    values = set()
    for run in runs:
        flat = flatten(run.config)
        values.add(next((str(flat[k]) for k in keys if flat.get(k) not in (None, "")), None))
    return values.pop() if len(values) == 1 else None


def sweep_group(runs: list[Run]) -> str:
    """The runs' shared `sweep` name or logger group, else the sweep dir's name (above the one with multirun.yaml)."""
    group = _common(runs, ("sweep", "logger.group", "logger.wandb.group"))
    if group and "${" not in group:
        return group
    for parent in runs[0].path.parents:
        if (parent / "multirun.yaml").is_file():
            return parent.name if parent.parent.name.lower() in _SWEEP_CONTAINERS else parent.parent.name
    common = Path(os.path.commonpath([str(r.path) for r in runs]))
    return common.name or "comparison"


def _project(runs: list[Run]) -> str:
    project = _common(runs, ("logger.project", "logger.wandb.project"))
    return project if project and "${" not in project else "gptlab"


def log_comparison(cmp: Comparison, images: dict[str, Path], runs: list[Run], out: Path) -> Path | None:
    """Log the table and PNGs; returns the local W&B run dir, or None (with a warning) if logging failed."""
    try:
        import wandb

        group = sweep_group(runs)
        run = wandb.init(project=_project(runs), group=group, job_type="comparison", name=f"compare-{group}",
                         dir=os.environ.get("WANDB_DIR") or str(out),
                         config={"step": cmp.step, "baseline": cmp.baseline, "runs": [str(r.path) for r in runs]})
        try:
            local_dir = Path(run.dir).parent
            # A W&B table cell holds a scalar: the identical-model labels become one string.
            rows = [["; ".join(v) if isinstance(v := getattr(r, c), list) else v for c in TABLE_COLUMNS]
                    for r in cmp.rows]
            payload = {"comparison": wandb.Table(columns=TABLE_COLUMNS, data=rows)}
            payload.update({f"plots/{name}": wandb.Image(str(p)) for name, p in images.items()})
            run.log(payload)
            run.summary.update({"step": cmp.step, "baseline": cmp.baseline, "warnings": len(cmp.warnings)})
        finally:
            run.finish()
        return local_dir
    except Exception as exc:  # logging must never fail the comparison itself
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"warning: W&B logging failed ({first}); the local report is complete", file=sys.stderr)
        return None
