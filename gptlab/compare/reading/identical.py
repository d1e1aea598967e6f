"""Identical arms: groups that build the same model (equal fingerprint) and differ only in model config.

Two such arms are one experiment run twice: every difference between them is noise. Arms with the same
model but another optimizer, schedule or hardware setting are different experiments and are not flagged.
"""

from __future__ import annotations

from collections.abc import Iterable

from gptlab.compare.reading.group import Group, diff_items

# Config sections that only describe the model; the fingerprint covers what they build.
MODEL_SECTIONS = frozenset({"model", "attention", "mlp", "norm", "position"})


def model_only(keys: Iterable[str]) -> bool:
    """True when every differing key (a choice `attention` or leaf `attention.n_kv_head`) is model config."""
    return all(key.split(".", 1)[0] in MODEL_SECTIONS for key in keys)


def shared(g: Group, key: str) -> str | None:
    """summary.json `key` common to every run of the group; None when any run lacks it or they disagree."""
    values = {r.summary.get(key) for r in g.runs}
    value = values.pop() if len(values) == 1 else None
    return value if isinstance(value, str) and value else None


def same_experiment(a: Group, b: Group) -> bool:
    """Equal model fingerprints, no data fingerprint mismatch, and only model config tells them apart."""
    fa = shared(a, "model_fingerprint")
    if fa is None or fa != shared(b, "model_fingerprint"):
        return False
    da, db = shared(a, "data_fingerprint"), shared(b, "data_fingerprint")
    if da is not None and db is not None and da != db:
        return False
    return model_only(k for k, _ in diff_items(a, b, hide_implied=False))


def identical_groups(groups: list[Group]) -> dict[int, list[Group]]:
    """id(group) -> the other groups that are the same experiment (only groups that have any)."""
    out: dict[int, list[Group]] = {}
    for i, a in enumerate(groups):
        for b in groups[i + 1 :]:
            if same_experiment(a, b):
                out.setdefault(id(a), []).append(b)
                out.setdefault(id(b), []).append(a)
    return out


def mixed_fingerprints(g: Group) -> bool:
    """True when the group's runs recorded different model fingerprints (code changed between seeds?)."""
    return len({r.summary.get("model_fingerprint") for r in g.runs} - {None}) > 1
