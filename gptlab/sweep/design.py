"""The designs a sweep expands to beyond arm x seed: a scale ladder (every arm at every size) and a 2^k factorial.

A ladder is `KEY=V1,V2,...` over a size key (`model` presets, or model.d_model / model.n_layer / model.n_head);
several keys move together rung by rung (same number of values each). Each rung gets a name for its run dirs,
`<arm>/<rung>/seed<k>` (gptlab/sweep/layout.py): `d_model64`, or the preset name for `model=`, or the keys' names joined
with `-`.

A factorial is `factors: {name: [overrides...]}`: k binary changes on top of the sweep's shared overrides (the
baseline level). Its 2^k arms are `base` (none on) and every combination, named by its factors joined with `+` in
the file's order (`gqa`, `gqa+sdpa`, ...).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from gptlab.errors import ConfigError
from gptlab.sweep.layout import BASE_ARM, NAME, RUN_SEP, cell_arm, rung_name

LADDER_KEYS = ("model", "model.d_model", "model.n_layer", "model.n_head")  # sizes; block_size would change the task
MAX_FACTORS = 6  # 64 arms


@dataclass(frozen=True)
class Rung:
    """One size of a ladder: its name (the run-dir level) and the overrides that set it."""

    name: str
    overrides: tuple[str, ...]


def _values(key: str, raw) -> list[str]:
    values = [str(v).strip() for v in raw] if isinstance(raw, (list, tuple)) else str(raw).split(",")
    values = [v.strip() for v in values]
    if len(values) < 2 or any(not v for v in values):
        raise ConfigError(f"ladder {key}: give at least 2 comma-separated values (e.g. {key}=64,128,256)")
    if len(set(values)) != len(values):
        raise ConfigError(f"ladder {key}: {','.join(values)} lists a value twice (two rungs would be one size)")
    if key != "model" and not all(v.isdigit() and int(v) > 0 for v in values):
        raise ConfigError(f"ladder {key}: {','.join(values)}; allowed: positive integers")
    return values


def parse_ladder(given) -> dict[str, list[str]]:
    """--ladder KEY=V1,V2 (repeatable: a list of such strings) or a sweep file's `ladder:` mapping -> {key: values}."""
    if isinstance(given, dict):
        items = [(str(k), v) for k, v in given.items()]
    else:
        texts = [given] if isinstance(given, str) else list(given)
        items = []
        for text in texts:
            key, sep, rest = str(text).partition("=")
            if not sep:
                raise ConfigError(f"ladder {text!r}: allowed: KEY=V1,V2,... (e.g. model.d_model=64,128,256)")
            items.append((key.strip(), rest))
    ladder: dict[str, list[str]] = {}
    for key, raw in items:
        if key not in LADDER_KEYS:
            raise ConfigError(f"ladder key '{key}' is not a size key; allowed: {', '.join(LADDER_KEYS)}")
        if key in ladder:
            raise ConfigError(f"ladder key '{key}' is given twice")
        ladder[key] = _values(key, raw)
    if not ladder:
        raise ConfigError("ladder: empty; allowed: KEY=V1,V2,... (e.g. model.d_model=64,128,256)")
    counts = {len(v) for v in ladder.values()}
    if len(counts) > 1:
        raise ConfigError(f"ladder keys move together rung by rung: give each the same number of values ({ladder})")
    if "model" in ladder and len(ladder) > 1:
        raise ConfigError("ladder: model=<presets> sets every size at once; give it alone")
    return ladder


def rungs(ladder: dict[str, list[str]]) -> list[Rung]:
    """The ladder's rungs in the given order, each named for its run dirs."""
    out = []
    for i in range(len(next(iter(ladder.values())))):
        parts = [(key, values[i]) for key, values in ladder.items()]
        name = rung_name(parts)
        if not NAME.match(name):
            raise ConfigError(f"ladder rung '{name}': allowed characters: letters, digits and _ . -")
        out.append(Rung(name, tuple(f"{k}={v}" for k, v in parts)))
    return out


def ladder_conflicts(ladder: dict[str, list[str]], overrides: list[str]) -> str | None:
    """The first of an arm's overrides that sets a key the ladder sets (it would be overridden at every rung), or a
    model.* key under a `model=` ladder (it would pin part of the size at every rung)."""
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if key in ladder or ("model" in ladder and key.startswith("model.")):
            return override
    return None


def factorial_arms(factors) -> dict[str, list[str]]:
    """`factors: {name: [overrides]}` -> the 2^k arms {base: [], a: [...], a+b: [...], ...}; refuses overlaps."""
    if not isinstance(factors, dict) or not factors:
        raise ConfigError("factors: allowed: a mapping of factor names to lists of overrides (k >= 1 factors)")
    if len(factors) > MAX_FACTORS:
        raise ConfigError(
            f"factors: {len(factors)} factors is {2 ** len(factors)} arms; allowed: at most {MAX_FACTORS}"
        )
    owner: dict[str, str] = {}
    for name, overrides in factors.items():
        if not isinstance(name, str) or not NAME.match(name) or RUN_SEP in name or name == BASE_ARM:
            raise ConfigError(f"factor name {name!r}: allowed: letters, digits and _ . - (not '{BASE_ARM}', no '+')")
        if not isinstance(overrides, list) or not overrides or not all(isinstance(o, str) for o in overrides):
            raise ConfigError(f"factor '{name}' must be a non-empty list of override strings, got {overrides!r}")
        for override in overrides:
            key = override.lstrip("+~").split("=", 1)[0]
            if key in owner and owner[key] != name:
                raise ConfigError(
                    f"factors '{owner[key]}' and '{name}' both set {key}: the combined arm would depend on their order"
                )
            owner[key] = name
    names = list(factors)
    arms: dict[str, list[str]] = {BASE_ARM: []}
    for size in range(1, len(names) + 1):
        for combo in itertools.combinations(names, size):
            arms[cell_arm(combo)] = [o for name in combo for o in factors[name]]
    return arms
