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
