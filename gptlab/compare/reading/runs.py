"""Find run directories and read what each one recorded (metrics.jsonl, summary.json, decode.json, .hydra/*.yaml)."""

from __future__ import annotations

import glob
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from gptlab.errors import ConfigError
from gptlab.sinks.evals import EVAL_FILE, read_evals
from gptlab.sinks.jsonl import SUMMARY_FILE, read_summary
from gptlab.util.metric_names import canonical

RUN_MARKERS = ("summary.json", "metrics.jsonl", "decode.json")  # decode.json: gptlab-decode's measurements
_GLOB_CHARS = re.compile(r"[*?\[]")


def natural_key(path: Path) -> list:
    """Sort key that orders job dirs 0, 1, 2, ..., 10 numerically rather than as text."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", str(path))]


@dataclass
class Run:
    """One run directory as read from disk; `by_step` maps step -> merged metrics record at that step."""

    path: Path
    records: list[dict[str, Any]]
    summary: dict[str, Any]
    config: dict[str, Any]
    overrides: list[str]
    choices: dict[str, str]
    by_step: dict[int, dict[str, Any]] = field(default_factory=dict)
    decode: dict[str, Any] = field(default_factory=dict)  # decode.json, when gptlab-decode measured this run
    provenance: dict[str, Any] = field(default_factory=dict)  # provenance.json (code, packages, hardware), if written
    evals: dict[str, Any] = field(default_factory=dict)  # eval.json, when gptlab-eval measured this run

    @property
    def status(self) -> str:
        """summary.json `status`, or "missing" when the run wrote no summary (crashed early?)."""
        return str(self.summary.get("status", "missing"))

    @property
    def last_step(self) -> int:
        """Largest step any metrics record mentions (0 for an empty metrics file)."""
        return max((int(r["step"]) for r in self.records if "step" in r), default=0)

    def val_steps(self) -> list[int]:
        """Sorted steps at which this run measured `val/loss`."""
        return sorted(s for s, rec in self.by_step.items() if rec.get("val/loss") is not None)


def common_root(runs: list[Run]) -> str:
    """The compared runs' common folder ("" for a single run): what messages name runs relative to."""
    return os.path.commonpath([str(r.path) for r in runs]) if len(runs) > 1 else ""


def where(run: Run, root: str) -> str:
    """How a message names a run: its dir relative to `root` (common_root), or in full without one."""
    return os.path.relpath(run.path, root) if root else str(run.path)


def is_run_dir(path: Path) -> bool:
    """True when the folder holds a run's files (summary.json, metrics.jsonl or decode.json)."""
    return any((path / m).is_file() for m in RUN_MARKERS)


def _search(root: Path) -> list[Path]:
    """Run dirs at or below `root`; a run dir's own subfolders (checkpoints, wandb) are not searched."""
    if is_run_dir(root):
        return [root]
    found: list[Path] = []
    for child in sorted((c for c in root.iterdir() if c.is_dir()), key=natural_key):
        if child.name.startswith(".") or child.name == "wandb":
            continue
        found.extend(_search(child))
    return found


def expand_paths(paths: list[str]) -> list[Path]:
    """Expand globs and check existence; a missing path is a ConfigError naming it."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.exists():
            out.append(p)
            continue
        matches = sorted(glob.glob(raw), key=lambda s: natural_key(Path(s))) if _GLOB_CHARS.search(raw) else []
        if not matches:
            raise ConfigError(f"path '{raw}' does not exist (give run directories, sweep directories or a glob)")
        out.extend(Path(m) for m in matches)
    return out


def discover(paths: list[str]) -> list[Path]:
    """All run dirs under the given paths, deduplicated, in command-line then natural order."""
    seen: dict[Path, None] = {}
    for p in expand_paths(paths):
        if p.is_file():
            p = p.parent
        if not any(p.iterdir()):
            raise ConfigError(f"'{p}' is an empty directory (expected a run or sweep directory)")
        runs = _search(p)
        if not runs:
            raise ConfigError(f"'{p}' contains no run directories (none has {', '.join(RUN_MARKERS)})")
        for r in runs:
            seen.setdefault(r.resolve(), None)
    return list(seen)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Metric records; a torn final line (run killed mid-write) is dropped, a bad inner line is an error.

    Two rows with a val/loss at one step are refused as a damaged file: a run evaluates once per step (a resume
    drops the rows after its checkpoint before it appends), so one of them is not this run's, and which is unknown.
    """
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    records = []
    evals: dict[Any, int] = {}  # step -> line of its val/loss row
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):
                break
            raise ConfigError(f"{path}:{i}: not a JSON object line (metrics.jsonl needs one object per line)") from None
        if isinstance(rec, dict) and "step" in rec:
            if rec.get("val/loss") is not None:
                first = evals.setdefault(rec["step"], i)
                if first != i:
                    raise ConfigError(
                        f"{path}: two val/loss rows at step {rec['step']} (lines {first} and {i}): a damaged "
                        "metrics file (one run evaluates once per step); keep one of them or leave this run out"
                    )
            records.append(canonical(rec))  # an older run's bare names (lr, tokens_per_s, ...) under today's
    return records


def _read_yaml(path: Path, default: Any) -> Any:
    if not path.is_file():
        return default
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    return default if data is None else data


def _choices(path: Path, summary: dict[str, Any]) -> dict[str, str]:
    """Group -> choice name from summary.json, else from Hydra's runtime choices in .hydra/hydra.yaml."""
    choices = summary.get("choices")
    if not isinstance(choices, dict):
        hydra_cfg = _read_yaml(path / ".hydra" / "hydra.yaml", {})
        choices = ((hydra_cfg.get("hydra") or {}).get("runtime") or {}).get("choices") or {}
    return {str(k): str(v) for k, v in choices.items() if not str(k).startswith("hydra/") and v is not None}


# figures compare does arithmetic on: a non-number there is a damaged file, never a silently skipped value
NUMERIC = (
    "final_val_loss",
    "best_val_loss",
    "steps",
    "tokens",
    "tokens_per_s_median",
    "step_ms_median",
    "mfu_median",
    "peak_mem_bytes",
    "params",
    "flops_per_token",
    "wall_s",
    "train_s",
    "flops",
    "outside_load",
    "val/loss",
    "train/loss",
    "perf/tokens_per_s",
    "perf/step_ms",
    "perf/mfu",
    "mem/peak_bytes",
    "train/lr",
    "train/grad_norm",
    "val/acc",
)


def _check_numbers(where: str, values: dict[str, Any]) -> None:
    """Refuse a figure that is neither a number nor null, naming the file and key; and a val/* or probe/* figure that
    is not finite. gptlab writes a figure it could not measure as null; a NaN seed's val loss made Welch's p NaN,
    "within noise". A non-finite train/loss stays readable: it is how a diverged step looks (the lr grid's test)."""
    extra = (k for k in values if str(k).startswith(("probe/", "val/")))  # capability probes, extra val sets
    for key in (*NUMERIC, *extra):
        value = values.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"{where}: {key}={value!r} is not a number (a damaged or hand-edited file?)")
        if value is not None and str(key).startswith(("val/", "probe/")) and not math.isfinite(value):
            raise ConfigError(
                f"{where}: {key}={value!r} is not finite (gptlab writes a figure it could not measure as null: "
                "a damaged or hand-edited file?)"
            )


def load_run(path: Path) -> Run:
    """Read one run directory; missing optional files become empty values."""
    records = _read_jsonl(path / "metrics.jsonl")
    summary = read_summary(path / SUMMARY_FILE)  # range-checked there; probe/* and the rest below
    _check_numbers(f"{path / SUMMARY_FILE}", summary)
    for rec in records:
        _check_numbers(f"{path / 'metrics.jsonl'} step {rec.get('step')}", rec)
    # provenance.json's copy is written by the run itself; .hydra/ is rewritten by any later launch into the dir,
    # even one that is then refused (a multirun job pointed at an old run): it may describe another config
    decode = _read_json(path / "decode.json")
    provenance = _read_json(path / "provenance.json")
    own = provenance or decode  # gptlab-decode keeps its own config in decode.json
    config = own["config"] if isinstance(own.get("config"), dict) else _read_yaml(path / ".hydra" / "config.yaml", {})
    overrides = (
        own["overrides"]
        if isinstance(own.get("config"), dict) and isinstance(own.get("overrides"), list)
        else _read_yaml(path / ".hydra" / "overrides.yaml", [])
    )
    if not isinstance(config, dict) or not isinstance(overrides, list):
        raise ConfigError(f"{path}/.hydra: config.yaml must be a mapping and overrides.yaml a list")
    by_step: dict[int, dict[str, Any]] = {}
    for rec in records:
        # Train and eval records may share a step; merge them so wall_s/tokens sit next to val/loss.
        by_step.setdefault(int(rec["step"]), {}).update({k: v for k, v in rec.items() if v is not None})
    return Run(
        path,
        records,
        summary,
        config,
        [str(o) for o in overrides],
        _choices(path, summary or decode),
        by_step,
        decode,
        provenance,
        read_evals(path / EVAL_FILE) if (path / EVAL_FILE).exists() else {},
    )


# The file gptlab.sinks.wandb keeps a run's W&B id in (compare imports nothing of training, so named here too).
WANDB_ID_FILE = "wandb_run_id"
_WANDB_ID = re.compile(r"^[a-z0-9_-]{1,64}$")


def _setting(config: dict[str, Any], *dotted: str) -> str | None:
    """The first of the dotted config keys that holds a resolved, non-empty value."""
    for key in dotted:
        node: Any = config
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node not in (None, "") and not isinstance(node, (dict, list)) and "${" not in str(node):
            return str(node)
    return None


def wandb_identity(run: Run) -> dict[str, Any]:
    """The run's W&B {id, project, entity, group}: summary.json "wandb", else the id file and the logger config."""
    recorded: dict = cast(dict, run.summary.get("wandb")) if isinstance(run.summary.get("wandb"), dict) else {}
    id_file = run.path / WANDB_ID_FILE
    stored = id_file.read_text(encoding="utf-8").strip() if id_file.is_file() else ""
    cfg = run.config
    found = {
        "id": recorded.get("id") or (stored if _WANDB_ID.match(stored) else None),
        "project": recorded.get("project") or _setting(cfg, "logger.wandb.project", "logger.project"),
        "entity": recorded.get("entity") or _setting(cfg, "logger.wandb.entity", "logger.entity"),
        "group": recorded.get("group") or _setting(cfg, "logger.wandb.group", "logger.group"),
    }
    return {k: (str(v) if v is not None else None) for k, v in found.items()}
