"""What a dashboard sees of a run: a flat config to group and filter by, the group, a short name and tags.

W&B can group and filter runs by config keys, not by tags, so every group choice is its own key
(`choice/attention: gqa`), next to the sweep, arm, seeds, model size, cost and code version. One
multirun is one group: the sweep name, else the multirun's own id (its sweep dir's name).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gptlab.util.paths import CONF_DIR
from gptlab.util.tree import flatten

HIDDEN_LEAVES = ("_target_", "_partial_")  # instantiate's wiring, not a setting anyone groups by


@dataclass
class Launch:
    """How this run was launched: alone, or as job `job_overrides` of a multirun over `varying` keys."""

    multirun_id: str | None = None
    varying: list[str] = field(default_factory=list)


def _sweep_keys(multirun_file: Path) -> list[str]:
    """The keys a multirun sweeps over (`attention=mha,gqa` -> attention), from its multirun.yaml."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        saved = yaml.safe_load(multirun_file.read_text())
        task = saved["hydra"]["overrides"]["task"]
        parsed = OverridesParser.create().parse_overrides(list(task))
    except Exception:  # noqa: BLE001 - a missing or unreadable file only costs the short name
        return []
    return [o.key_or_group for o in parsed if o.is_sweep_override()]


def launch_info() -> Launch:
    """This process's launch, read from Hydra's runtime config (a plain Launch outside @hydra.main or for one run)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return Launch()
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return Launch()
    # the multirun's own dir: the job dir minus its subdir (hydra.sweep.subdir may be nested, e.g. gqa/seed0)
    depth = len(Path(str(hc.sweep.subdir)).parts)
    root = Path(hc.runtime.output_dir).parents[depth - 1] if depth else Path(hc.runtime.output_dir)
    return Launch(multirun_id=root.name, varying=_sweep_keys(root / "multirun.yaml"))


def run_group(logger_group: str | None, sweep: str | None, launch: Launch) -> str:
    """logger.wandb.group, else $WANDB_RUN_GROUP, else the sweep name, else the multirun's id, else "default" (a
    single run). As in wandb.init, a key set explicitly beats the environment, which beats gptlab's own defaults."""
    return str(logger_group or os.environ.get("WANDB_RUN_GROUP") or sweep or launch.multirun_id or "default")


def _override_values(overrides: list[str]) -> dict[str, str]:
    """{"attention": "gqa", "mlp.ratio": "3"} from ["attention=gqa", "mlp.ratio=3"] (+/~ prefixes dropped)."""
    out = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep:
            out[key.lstrip("+~")] = value
    return out


def run_name(
    name: str | None, arm: str | None, seed: int, overrides: list[str], launch: Launch, groups: set[str]
) -> str:
    """A short readable name: `name`, else `<arm> s<seed>`, else the varying overrides + `s<seed>`, else all overrides.

    A varying group choice shows as its option (`gqa`), any other key as `key=value` (`mlp.ratio=3`).
    """
    if name:
        return str(name)
    if arm:
        return f"{arm} s{seed}"
    values = _override_values(overrides)
    if launch.varying:
        parts = [
            values[k] if k in groups else f"{k}={values[k]}" for k in launch.varying if k in values and k != "seed"
        ]
        return " ".join([*parts, f"s{seed}"])
    keep = [o for o in overrides if not o.split("=")[0].lstrip("+~").startswith(("hydra", "train.resume", "sweep"))]
    return ",".join(keep) or "default"


def flat_config(config: dict, choices: dict[str, str], extras: dict) -> dict:
    """`choice/<group>` for every group, `extras` (params, git, ...), then every resolved dotted key.

    Left out: `_target_`/`_partial_` leaves and the logger block (how the run is logged, not what it is).
    """
    out: dict = {f"choice/{g}": str(v) for g, v in sorted(choices.items())}
    out |= {k: config.get(k) for k in ("sweep", "arm", "seed", "data_seed")}
    out |= extras
    for key, value in flatten(config).items():
        if key.split(".")[0] == "logger" or key.rsplit(".", 1)[-1] in HIDDEN_LEAVES:
            continue
        out.setdefault(key, value)
    return out


def default_choices(root: Path = CONF_DIR / "train.yaml") -> dict[str, str]:
    """Each group's default option in the root config's defaults list (a list default joined with '+', as
    choices name it); groups without a default are left out."""
    picked: dict[str, str] = {}
    for entry in yaml.safe_load(root.read_text()).get("defaults", []):
        if isinstance(entry, dict):
            for group, option in entry.items():
                if option is not None and not str(group).startswith("override "):
                    picked[str(group)] = "+".join(option) if isinstance(option, list) else str(option)
    return picked


def tags(extra: list | None, choices: dict[str, str]) -> list[str]:
    """The user's logger tags (else $WANDB_TAGS, comma-separated, as wandb reads it) plus one `group=option` tag per choice that differs from conf/train.yaml's default
    (every choice is a config key too, choice/<group>, to filter by; a tag per default would repeat on every run)."""
    defaults = default_choices()
    differs = {k: v for k, v in choices.items() if k != "logger" and defaults.get(k) != v}
    given = extra or [t.strip() for t in os.environ.get("WANDB_TAGS", "").split(",") if t.strip()]  # tags beat env
    return [*(str(t) for t in given), *(f"{k}={v}" for k, v in sorted(differs.items()))]
