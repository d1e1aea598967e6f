"""--threshold: the smallest value of the one varying key whose arm reaches a target in every seed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gptlab.compare.reading.group import Group, diff_items
from gptlab.compare.tables.target import Target, TargetResult
from gptlab.errors import ConfigError


def varying_keys(groups: list[Group]) -> list[str]:
    """Config keys (choices first, then leaves) on which some pair of groups differs; a leaf a varying choice sets
    (attention=gqa's n_kv_head) varies with that choice, not as a key of its own, unless a run overrode it."""
    keys: dict[str, None] = {}
    for i, g in enumerate(groups):
        for h in groups[i + 1 :]:
            for key, _ in diff_items(g, h, name_values=False) + diff_items(h, g, name_values=False):
                keys.setdefault(key, None)
    return list(keys)


def pick_key(groups: list[Group], key: str | None) -> str:
    """--threshold-key, checked; else the one key that varies between the groups."""
    varying = varying_keys(groups)
    if len(groups) < 2:
        raise ConfigError("--threshold needs arms that differ in one config key; all runs share one configuration")
    if key is None:
        if len(varying) != 1:
            raise ConfigError(
                f"--threshold: the arms differ in {len(varying)} keys ({', '.join(varying)}); "
                "name the one to minimise with --threshold-key KEY"
            )
        return varying[0]
    values = [g.value(key) for g in groups]
    if all(v is None for v in values):
        raise ConfigError(f"--threshold-key '{key}': no arm has that key; keys that vary: {', '.join(varying)}")
    seen: dict[str | None, Group] = {}
    for g, v in zip(groups, values):
        if v in seen:
            raise ConfigError(
                f"--threshold-key {key}: arms '{seen[v].label}' and '{g.label}' both have {key}={v}; "
                f"compare them separately (keys that vary: {', '.join(varying)})"
            )
        seen[v] = g
    return key


def _numeric(values: list[str]) -> list[float] | None:
    try:
        return [float(v) for v in values]
    except (TypeError, ValueError):
        return None


@dataclass
class Threshold:
    """The answer to "smallest value of key reaching target in every seed" and every arm's count."""

    target: Target
    key: str
    answer: str | None
    numeric: bool
    arms: list[dict[str, Any]]
    sentence: str
    monotone: bool = True  # False: a larger value than the answer misses the target in some seed

    def to_json(self) -> dict[str, Any]:
        """The comparison.json `thresholds` entry."""
        return {
            "target": self.target.text,
            "key": self.key,
            "answer": self.answer,
            "numeric": self.numeric,
            "arms": self.arms,
            "sentence": self.sentence,
            "monotone": self.monotone,
        }


def threshold(groups: list[Group], result: TargetResult, key: str | None) -> Threshold:
    """Order the arms by the varying key (numerically when every value is a number) and find the first full hit."""
    key = pick_key(groups, key)
    values = [g.value(key) or "unset" for g in groups]
    nums = _numeric(values)
    order = sorted(range(len(groups)), key=lambda i: nums[i]) if nums else list(range(len(groups)))
    arms: list[dict[str, Any]] = [
        {
            "value": values[i],
            "label": groups[i].label,
            "n_reached": result.rows[i].n_reached,
            "n_seeds": result.rows[i].n_seeds,
        }
        for i in order
    ]
    full = [a for a in arms if a["n_reached"] == a["n_seeds"]]
    counts = ", ".join(f"{key}={a['value']}: {a['n_reached']}/{a['n_seeds']}" for a in arms)
    what = f"smallest {key}" if nums else f"first {key} in the table's order ({', '.join(a['value'] for a in arms)})"
    text = result.target.text
    if not full:
        sentence = f"none of the arms reaches {text} in every seed (seeds that reached it: {counts})"
        return Threshold(result.target, key, None, nums is not None, arms, sentence)
    win = full[0]
    above = [a for a in arms[arms.index(win) + 1 :] if a["n_reached"] < a["n_seeds"]]
    caveat = (
        "; larger but not in every seed: "
        + ", ".join(f"{key}={a['value']} ({a['n_reached']}/{a['n_seeds']})" for a in above)
        if above
        else ""
    )
    sentence = (
        f"{what} reaching {text} in every seed ({win['n_reached']}/{win['n_seeds']}): {win['value']} "
        f"(seeds that reached it: {counts}{caveat})"
    )
    if above and nums:  # 2 passes, 3 fails, 4 passes: a threshold would not do that
        sentence += (
            f"; caution: not monotone in {key}, so the answer may be the seeds' luck rather than a threshold "
            "(add seeds to the arms that missed it, e.g. gptlab-sweep NAME --until-decided)"
        )
    return Threshold(result.target, key, win["value"], nums is not None, arms, sentence, monotone=not above)
