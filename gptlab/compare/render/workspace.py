"""A saved W&B workspace view of a sweep (wandb_workspaces): val/loss vs step, tokens, training and wall time by arm
(else by each varying choice), speed and memory panels, runs filtered to the sweep's W&B group. Offline it is written
as JSON and pushed later:

    python -m gptlab.compare.render.workspace push <out>/workspace.json [--entity ENTITY]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gptlab.compare.reading.group import IGNORED_CHOICES, SEED_KEYS, is_bookkeeping
from gptlab.compare.reading.runs import Run
from gptlab.compare.render.wandb_log import entity_of, project_of, sweep_group
from gptlab.errors import ConfigError
from gptlab.util.tree import flatten

SPEC_FILE = "workspace.json"
# x-axis key -> its title (training time: each step's time summed; wall time: evals and checkpoints too)
LOSS_AXES = {"step": "step", "tokens": "tokens", "train_s": "training time (s)", "wall_s": "wall time (s)"}
SPEED_METRICS = {"perf/tokens_per_s": "tokens/s", "perf/mfu": "MFU", "mem/peak_bytes": "peak memory (bytes)"}
ARM_KEY = "arm"  # the sweep arm: the grouping when neither a choice nor a config value differs


def varying_choices(runs: list[Run]) -> list[str]:
    """Choice groups whose option differs among the runs, in first-seen order (logger/launcher left out)."""
    seen: dict[str, set[str]] = {}
    for run in runs:
        for group, choice in run.choices.items():
            if group not in IGNORED_CHOICES:
                seen.setdefault(group, set()).add(choice)
    return [g for g, values in seen.items() if len(values) > 1 or any(g not in r.choices for r in runs)]


def varying_leaves(runs: list[Run]) -> list[str]:
    """Dotted config keys whose value differs among the runs (seeds, bookkeeping and _target_ left out)."""
    flats = [flatten(r.config, empty_as_leaf=True) for r in runs]
    keys = sorted(set().union(*flats))

    def differs(key: str) -> bool:
        return len({json.dumps(f.get(key), sort_keys=True, default=str) for f in flats}) > 1

    return [
        k
        for k in keys
        if k not in SEED_KEYS and not is_bookkeeping(k) and not k.endswith(("_target_", "_partial_")) and differs(k)
    ]


def group_keys(runs: list[Run]) -> list[str]:
    """W&B config keys the view groups by: `arm` where every run records its sweep arm (each arm its own group: two
    arms of one choice, gqa with 4 and with 2 kv heads, stay apart), with the config values that vary within an arm
    (an lr grid's `optimizer.lr`); else `choice/<group>` per varying choice, else each varying config value, else
    `arm`."""
    arms: dict[str, list[Run]] = {}
    for run in runs:
        arm = run.config.get(ARM_KEY) if isinstance(run.config, dict) else None
        arms.setdefault(arm if isinstance(arm, str) and arm and "${" not in arm else "", []).append(run)
    if "" not in arms and len(arms) > 1:
        within = sorted({k for same in arms.values() for k in varying_leaves(same)})
        return [ARM_KEY, *within]
    return [f"choice/{g}" for g in varying_choices(runs)] or varying_leaves(runs) or [ARM_KEY]


def config_path(key: str) -> str:
    """Path of one of our flat W&B config keys: a dotted one (`optimizer.lr`) is stored as
    {"optimizer.lr": {"value": ...}}, so `.value` goes at the end (wandb_workspaces assumes nested dicts)."""
    return f"{key}.value" if "." in key else key


def _loss_section(key: str, max_runs: int):
    """val/loss against step, tokens, training time and wall time, grouped by one config key: mean line, min..max band."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    by = f"config.{config_path(key)}"
    panels = [
        wr.LinePlot(
            title=f"val/loss vs {title} by {key}",
            x=x,
            y=["val/loss"],
            groupby=by,
            groupby_aggfunc="mean",
            groupby_rangefunc="minmax",
            max_runs_to_show=max_runs,
            title_x=title,
            title_y="val/loss",
        )
        for x, title in LOSS_AXES.items()
    ]
    return ws.Section(
        name=f"val/loss by {key}",
        panels=panels,  # type: ignore[arg-type]  # invariant list in wandb_workspaces
        is_open=True,
        panel_settings=ws.SectionPanelSettings(x_axis="step"),
    )


def _speed_section(key: str | None, max_runs: int):
    """tokens/s, MFU and peak memory against step, grouped by key (None: the runs table's nested grouping by
    every varying key): mean line, ± std band."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    by = f"config.{config_path(key)}" if key else None
    panels = [
        wr.LinePlot(
            title=f"{title} by {key or 'run set grouping'}",
            x="step",
            y=[metric],
            groupby=by,
            groupby_aggfunc="mean",
            groupby_rangefunc="stddev",
            aggregate=True,
            max_runs_to_show=max_runs,
            title_x="step",
            title_y=title,
        )
        for metric, title in SPEED_METRICS.items()
    ]
    return ws.Section(
        name="speed and memory",
        panels=panels,  # type: ignore[arg-type]  # invariant list in wandb_workspaces
        is_open=True,
        panel_settings=ws.SectionPanelSettings(x_axis="step"),
    )


def build_workspace(runs: list[Run], group: str, project: str, entity: str | None):
    """The Workspace model: one val/loss section per varying key, one speed section (by that key, or by the
    run set's nested grouping when several vary), the sweep's training runs only, grouped by every varying key."""
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces import expr

    keys = group_keys(runs)
    max_runs = max(10, len(runs))
    speed = _speed_section(keys[0] if len(keys) == 1 else None, max_runs)
    return ws.Workspace(
        entity=entity or "",
        project=project,
        name=f"gptlab sweep {group}",
        sections=[_loss_section(k, max_runs) for k in keys] + [speed],
        settings=ws.WorkspaceSettings(x_axis="step", max_runs=max_runs),
        runset_settings=ws.RunsetSettings(
            filters=expr.And(expr.Metric("Group") == group, expr.Metric("JobType") != "comparison"),
            groupby=[expr.Config(config_path(k)) for k in keys],
            pinned_columns=[f"config:{k}" for k in keys] + ["summary:final_val_loss"],
        ),
    )


def to_spec(workspace) -> dict[str, Any]:
    """The view as W&B stores it (the Workspace's internal View model, camelCase JSON)."""
    return json.loads(workspace._to_model().model_dump_json(by_alias=True, exclude_none=True))


def from_spec(spec: dict[str, Any]):
    """A Workspace back from its JSON spec."""
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces.workspaces import internal

    return ws.Workspace._from_model(internal.View.model_validate(spec))


def push(path: Path, entity: str | None = None) -> str:
    """Save the view in `path` to W&B (the spec's entity, else --entity, else your default entity); its URL."""
    from gptlab.sinks.wandb import api_key_configured

    if not path.is_file():
        raise ConfigError(f"'{path}' does not exist (write it with gptlab-compare --workspace)")
    if not api_key_configured():
        raise ConfigError("pushing a workspace needs a W&B API key (set WANDB_API_KEY or run `wandb login`)")
    try:
        spec = json.loads(path.read_text())
        workspace = from_spec(spec)
    except ValueError as exc:
        raise ConfigError(f"'{path}' is not a workspace spec ({str(exc).splitlines()[0]})") from None
    if entity or not workspace.entity:
        import wandb

        workspace.entity = entity or wandb.Api().default_entity
    return workspace.save().url


def publish(runs: list[Run], out: Path, mode: str) -> Path:
    """Write out/workspace.json; online also save the view and print its URL, else print how to push it."""
    from gptlab.sinks.wandb import resolve_mode

    group = sweep_group(runs)
    workspace = build_workspace(runs, group, project_of(runs), entity_of(runs))
    path = out / SPEC_FILE
    path.write_text(json.dumps(to_spec(workspace), indent=2) + "\n")
    print(f"W&B workspace: wrote {path} ({len(workspace.sections)} sections, runs of group '{group}')")
    if resolve_mode(mode) == "online":
        try:
            print(f"W&B workspace: saved {push(path)}")
            return path
        except Exception as exc:  # the view is on disk: saving it later is one command
            print(f"warning: saving the W&B workspace failed ({str(exc).strip().splitlines()[0]})", file=sys.stderr)
    print(f"W&B workspace: save it with: {sys.executable} -m gptlab.compare.render.workspace push {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    """`python -m gptlab.compare.render.workspace push FILE [--entity E]`: 0 saved, 2 bad input, 1 W&B refused it."""
    p = argparse.ArgumentParser(
        prog="python -m gptlab.compare.render.workspace",
        description="Save a workspace view written by gptlab-compare --workspace to W&B.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("push", help="save the view in FILE to W&B and print its URL")
    cmd.add_argument("file", type=Path, help="the workspace.json gptlab-compare --workspace wrote")
    cmd.add_argument("--entity", help="W&B entity (user or team) to save under; default: the spec's, else yours")
    args = p.parse_args(argv)
    try:
        print(push(args.file, args.entity))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"error: W&B did not save the workspace ({str(exc).strip().splitlines()[0]})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
