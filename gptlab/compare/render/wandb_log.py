"""The W&B side of a comparison: a job_type="comparison" run that links the compared runs' W&B ids and logs the
table as numbers, native W&B charts, and the report document's tables, sentences and PNGs. Same auto / online /
offline / disabled fallback as training; never fatal."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptlab.compare.reading.runs import Run, wandb_identity
from gptlab.compare.render import words
from gptlab.compare.render.sections import Document, Figures, Sentences, Shown, Table
from gptlab.compare.statistics import speed, stats
from gptlab.compare.tables.analysis import Comparison, Row
from gptlab.compare.tables.machine import run_mfu
from gptlab.errors import ConfigError
from gptlab.util.tree import flatten

TABLE_COLUMNS = [
    "label",
    "n_seeds",
    "val_loss_mean",
    "val_loss_std",
    "delta_val_loss",
    "significant",
    "p_value",
    "tokens_per_s",
    "tokens_per_s_std",
    "step_ms",
    "step_ms_std",
    "mfu",
    "mfu_during_training",
    "timed_tokens_per_s",
    "timed_step_ms",
    "peak_mem_bytes",
    "speedup",
    "speedup_p",
    "speed_verdict",
    "outside_load",
    "under_load",
    "model_fingerprint",
    "identical_to",
    "params",
    "flops_per_token",
]
STAT_COLUMNS = ["label", "mean", "std", "min", "max", "n_seeds"]
# Bar charts: metric -> (summary.json key, metrics.jsonl key, how one run's value is taken from its records).
BAR_METRICS = {
    "tokens_per_s": ("tokens_per_s_median", "perf/tokens_per_s", stats.median),
    "mfu": ("mfu_median", "perf/mfu", stats.median),
    "peak_mem_bytes": ("peak_mem_bytes", "mem/peak_bytes", max),
}
MODES = ("auto", "online", "offline", "disabled")
_SWEEP_CONTAINERS = {"sweeps", "multirun", "outputs", "runs"}


def check_mode(mode: str | None) -> None:
    """Refuse --wandb-mode online without an API key before any work, as training refuses logger.wandb.mode."""
    from gptlab.sinks.wandb import api_key_configured

    if mode == "online" and not api_key_configured():
        raise ConfigError(
            "--wandb-mode online needs a W&B API key (set WANDB_API_KEY or run `wandb login`); "
            "allowed without one: auto, offline, disabled"
        )


def wanted(flag: bool | None, mode: str | None = None) -> bool:
    """--wandb/--no-wandb win (--wandb-mode disabled beats both); an explicit mode or a WANDB_MODE other than
    "disabled" turns logging on."""
    if mode == "disabled":
        return False
    if flag is not None:
        return flag
    if mode is not None:
        return True
    env = os.environ.get("WANDB_MODE", "")
    return bool(env) and env != "disabled"


def _shared(values: list[Any]) -> str | None:
    """The one value every entry has (None when they differ or any is missing)."""
    distinct = set(values)
    return str(distinct.pop()) if len(distinct) == 1 and None not in distinct else None


def _common(runs: list[Run], keys: tuple[str, ...]) -> str | None:
    values = set()
    for run in runs:
        flat = flatten(run.config, empty_as_leaf=True)
        values.add(next((str(flat[k]) for k in keys if flat.get(k) not in (None, "")), None))
    return values.pop() if len(values) == 1 else None


def sweep_group(runs: list[Run]) -> str:
    """The runs' shared W&B group, `sweep` name or logger group, else the sweep dir's name."""
    group = _shared([wandb_identity(r)["group"] for r in runs])
    group = group or _common(runs, ("sweep", "logger.group", "logger.wandb.group"))
    if group and "${" not in group:
        return group
    for parent in runs[0].path.parents:
        if (parent / "multirun.yaml").is_file():
            return parent.name if parent.parent.name.lower() in _SWEEP_CONTAINERS else parent.parent.name
    common = Path(os.path.commonpath([str(r.path) for r in runs]))
    return common.name or "comparison"


def project_of(runs: list[Run]) -> str:
    """The W&B project the compared runs logged to (the logger's default "gptlab" when unknown or mixed)."""
    return _shared([wandb_identity(r)["project"] or "gptlab" for r in runs]) or "gptlab"


def entity_of(runs: list[Run]) -> str | None:
    """The W&B entity shared by the compared runs, or None (W&B's default entity)."""
    return _shared([wandb_identity(r)["entity"] for r in runs])


def linked_runs(cmp: Comparison) -> list[dict[str, Any]]:
    """One entry per compared run: its dir, W&B id/project/entity/group and its group's label."""
    out = []
    for g in cmp.groups:
        for run in g.runs:
            ident = wandb_identity(run)
            out.append(
                {
                    "path": str(run.path),
                    "wandb_id": ident["id"],
                    "project": ident["project"],
                    "entity": ident["entity"],
                    "group": ident["group"],
                    "label": g.label,
                }
            )
    return out


def offline_folders(runs: list[Run]) -> list[str]:
    """Offline W&B folders of the compared runs (summary.json "wandb"): to sync before the links resolve online."""
    out: list[str] = []
    for run in runs:
        recorded = run.summary.get("wandb")
        if isinstance(recorded, dict) and recorded.get("mode") == "offline":
            out.extend(str(f) for f in recorded.get("folders") or [])
    return out


def _cell(row: Row, column: str) -> Any:
    """One W&B cell: the speed verdict in the report's words, a list (identical-model labels) as one string."""
    if column == "speed_verdict":
        return words.speed(row.speed)
    if column == "speedup_p":
        return row.speed.p
    value = getattr(row, column)
    return "; ".join(value) if isinstance(value, list) else value


def table_rows(cmp: Comparison) -> list[list[Any]]:
    """The comparison table as W&B rows."""
    return [[_cell(r, c) for c in TABLE_COLUMNS] for r in cmp.rows]


def curve_series(cmp: Comparison) -> tuple[list[list[int]], list[list[float]], list[str]]:
    """val/loss vs step per group: a mean line, plus min and max lines (the seed band) when it has 2+ seeds."""
    xs, ys, keys = [], [], []
    for g in cmp.groups:
        steps = sorted({s for r in g.runs for s in r.val_steps()})
        per_step = [[float(r.by_step[s]["val/loss"]) for r in g.runs if s in r.val_steps()] for s in steps]
        series = [("mean", stats.mean)] + ([("min", min), ("max", max)] if len(g.runs) > 1 else [])
        for name, agg in series:
            xs.append(steps)
            ys.append([agg(v) for v in per_step])
            keys.append(f"{g.label} {name}")
    return xs, ys, keys


def _value(run: Run, metric: str, cmp: Comparison) -> float | None:
    """One run's figure for a bar chart; MFU against the comparison's one machine peak, as in the table."""
    if metric == "mfu" and cmp.peak is not None:
        return run_mfu(run, cmp.peak)
    summary_key, record_key, agg = BAR_METRICS[metric]
    return speed.run_speed(run, summary_key, record_key, agg)


def seed_stats(cmp: Comparison, metric: str) -> list[list[Any]]:
    """STAT_COLUMNS rows of one speed/memory metric over each group's seeds (groups without it left out)."""
    rows = []
    for g in cmp.groups:
        values = [v for r in g.runs if (v := _value(r, metric, cmp)) is not None]
        if values:
            rows.append([g.label, stats.mean(values), stats.std(values), min(values), max(values), len(values)])
    return rows


def error_bars(rows: list[list[Any]]) -> tuple[list[list[int]], list[list[float]], list[str]]:
    """Error bars as line segments: group i is a vertical segment at x=i from mean - std to mean + std."""
    xs, ys, keys = [], [], []
    for i, (label, mean, std, *_rest) in enumerate(rows, 1):
        half = std or 0.0  # one seed: no spread to show, a zero-length bar
        xs.append([i, i])
        ys.append([mean - half, mean + half])
        keys.append(f"{i}: {label}")
    return xs, ys, keys


def payload(cmp: Comparison, doc: Document) -> dict[str, Any]:
    """Everything the comparison run logs: the table as numbers, native charts, and the report document's tables,
    sentences and PNGs."""
    import wandb

    data: dict[str, Any] = {"comparison": wandb.Table(columns=TABLE_COLUMNS, data=table_rows(cmp))}  # type: ignore[arg-type]  # wandb: invariant list[str | int]
    xs, ys, keys = curve_series(cmp)
    data["charts/val_loss_vs_step"] = wandb.plot.line_series(
        xs, ys, keys, title="val/loss vs step: mean over seeds, min and max lines = seed band", xname="step"
    )
    for metric in BAR_METRICS:
        rows = seed_stats(cmp, metric)
        if not rows:
            continue
        table = wandb.Table(columns=STAT_COLUMNS, data=rows)  # type: ignore[arg-type]  # wandb: invariant list[str | int]
        data[f"charts/{metric}"] = wandb.plot.bar(table, "label", "mean", title=f"{metric}: mean over seeds")
        exs, eys, ekeys = error_bars(rows)
        data[f"charts/{metric}_error_bars"] = wandb.plot.line_series(
            exs, eys, ekeys, title=f"{metric}: mean ± std over seeds (one bar per group)", xname="group"
        )
    data.update(report_tables(doc))
    figures = [f for s in doc.sections if isinstance(s, Figures) for f in s.figures]
    data.update({f"plots/{f.name}": wandb.Image(str(f.path)) for f in figures})
    return data


def report_tables(doc: Document) -> dict[str, Any]:
    """The report document as W&B tables: every table and list of sentences the files show that has a key, named by
    it (a second one of a key gets `_2`, ...), the columns and cells as comparison.md words them."""
    import wandb

    out: dict[str, Any] = {}
    for s in doc.sections:
        if s.shown is Shown.TERMINAL or not s.key or not isinstance(s, (Table, Sentences)):
            continue
        name, i = s.key, 1
        while name in out:  # a report with two targets: target, target_2
            i += 1
            name = f"{s.key}_{i}"
        if isinstance(s, Table):
            out[name] = wandb.Table(columns=list(s.headers), data=[list(r) for r in s.rows])
        else:
            out[name] = wandb.Table(columns=[s.key.replace("_", " ")], data=[[line] for line in s.lines])
    return out


@dataclass
class Logged:
    """Where the comparison run went: its mode, local W&B folder, id and (offline) `wandb sync` command."""

    mode: str
    folder: Path | None
    run_id: str | None
    sync_command: str | None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _start(out: Path, mode: str, **init: Any):
    """A WandbSink in out/; its fallback warnings are printed here, one line each, instead of logged."""
    from gptlab.sinks.wandb import WandbSink

    failures: list[BaseException] = []

    class Recording(WandbSink):
        """WandbSink that remembers why a start failed."""

        def _init(self, m: str, init_args: dict) -> Any:
            try:
                return super()._init(m, init_args)
            except Exception as exc:
                failures.append(exc)
                raise

    sink_log = logging.getLogger("gptlab.sinks")
    was = sink_log.disabled
    sink_log.disabled = True
    try:
        sink = Recording(out, mode=mode, job_type="comparison", **init)
    finally:
        sink_log.disabled = was
    if sink.run is None and failures:
        raise RuntimeError(_first_line(failures[-1]))
    if failures:
        print(
            f"warning: W&B online start failed ({_first_line(failures[0])}); logging offline instead", file=sys.stderr
        )
    return sink


def log_comparison(cmp: Comparison, doc: Document, runs: list[Run], out: Path, mode: str = "auto") -> Logged | None:
    """Log the comparison to W&B; None (with one warning) when it could not be logged."""
    try:
        group = sweep_group(runs)
        config = {
            "step": cmp.step,
            "baseline": cmp.baseline,
            "sweep": group,
            "labels": [r.label for r in cmp.rows],
            "runs": linked_runs(cmp),
            **({"split": cmp.split} if cmp.split else {}),
        }
        part = "".join(f"-{k}={v}" for k, v in cmp.split.items())  # one W&B run per --split-by table
        sink = _start(
            out,
            mode,
            config=config,
            project=project_of(runs),
            entity=entity_of(runs),
            group=group,
            name=f"compare-{group}{part}",
            tags=["comparison"],
        )
        if sink.run is None:
            return Logged(sink.mode, None, None, None)
        try:
            sink.log(payload(cmp, doc), cmp.step)
            sink.summary(
                {
                    "step": cmp.step,
                    "baseline": cmp.baseline,
                    "warnings": len(cmp.warnings),
                    "n_runs": len(runs),
                    "n_groups": len(cmp.rows),
                }
            )
        finally:
            sink.close("finished")
        return Logged(sink.mode, sink.run_dir_path, sink.run_id, sink.sync_command)
    except Exception as exc:  # logging must never fail the comparison itself
        print(f"warning: W&B logging failed ({_first_line(exc)}); the local report is complete", file=sys.stderr)
        return None
