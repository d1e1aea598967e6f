"""--claims: a study's claimed speed-ups and loss differences, read from YAML and put on the comparison rows they
name, so gptlab-compare shows measured next to claimed."""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from gptlab.compare.reading.group import Group, matches
from gptlab.errors import ConfigError


def load_claims(path: str) -> dict[str, dict[str, float]]:
    """Read --claims YAML: label or choice string -> {speedup: x, delta_val_loss: y}."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--claims '{path}' does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"--claims {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--claims {path}: expected a mapping label -> {{speedup, delta_val_loss}}")
    out = {}
    for key, claim in data.items():
        if not isinstance(claim, dict) or not claim or set(claim) - {"speedup", "delta_val_loss"}:
            raise ConfigError(f"--claims {path}: '{key}' must map to speedup and/or delta_val_loss, got {claim!r}")
        try:
            out[str(key)] = {k: float(v) for k, v in claim.items()}
        except (TypeError, ValueError):
            raise ConfigError(f"--claims {path}: '{key}' values must be numbers, got {claim!r}") from None
        bad = [k for k, v in out[str(key)].items() if not math.isfinite(v) or (k == "speedup" and v <= 0)]
        if bad:  # a NaN claim would print as 'nan× claimed' beside a measured figure
            raise ConfigError(
                f"--claims {path}: '{key}'.{bad[0]} must be a finite number (a speedup > 0), got {claim[bad[0]]!r}"
            )
    return out


def attach_claims(rows: list, groups: list[Group], claims: dict[str, dict[str, float]]) -> None:
    """Put each claim on the one comparison row (compare.analysis.Row) whose label equals its key or whose config has all its key=value items."""
    for key, claim in claims.items():
        items = [s.strip() for s in key.split(",") if s.strip()]
        hits = [row for row in rows if row.label == key] or [
            row for row, g in zip(rows, groups) if all("=" in i and matches(g, i) for i in items)
        ]
        if len(hits) != 1:
            labels = "; ".join(r.label for r in rows)
            raise ConfigError(f"--claims: '{key}' matches {len(hits)} groups (need exactly 1); labels: {labels}")
        hits[0].claimed = claim
