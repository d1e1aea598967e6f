"""Where the shipped configs, sweeps and assets live, for both a checkout and an installed wheel."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # gptlab/


def _shipped(name: str) -> Path:
    """`gptlab/<name>` inside a wheel, else the checkout's top-level `<name>/` (editable installs)."""
    inside = PACKAGE_DIR / name
    if inside.is_dir():
        return inside
    return PACKAGE_DIR.parent / name


CONF_DIR = _shipped("conf")
SWEEPS_DIR = _shipped("sweeps")
ASSETS_DIR = PACKAGE_DIR / "data" / "assets"
# The config group of gptlab-sweep's generated per-run configs (gptlab/sweep/plan.py): bookkeeping, not a choice (their
# content is the arm's choices and keys, already in the config), so never a difference between runs. Here rather than
# in gptlab.config.build so that the sweep CLI's planning and status never import torch through the model.
SWEEP_RUN_GROUP = "sweep_run"


def user_cache(env: str | None) -> Path:
    """The user cache folder: $GPTLAB_CACHE (`env`), else ~/.cache/gptlab. A path that exists and is not a folder is
    refused in one line (as a file it would list as an empty cache and fail at the first write)."""
    from gptlab.errors import ConfigError

    path = Path(env or "~/.cache/gptlab").expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"GPTLAB_CACHE={path} is not a folder; point it at a folder (created when missing)")
    return path
