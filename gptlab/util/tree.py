"""Nested config dicts as one level of dotted keys, the one flattening every part of gptlab uses."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def flatten(tree: Mapping[str, Any] | None, prefix: str = "", empty_as_leaf: bool = False) -> dict[str, Any]:
    """{"model": {"d_model": 64}} -> {"model.d_model": 64}; lists stay whole values, None is {}.

    An empty mapping contributes no key, or with `empty_as_leaf` stays a leaf of its own ({"logger": {}} ->
    {"logger": {}}), which gptlab-compare uses so an arm with an empty group still shows the key.
    """
    out: dict[str, Any] = {}
    for key, value in (tree or {}).items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and (value or not empty_as_leaf):
            out.update(flatten(value, name + ".", empty_as_leaf))
        else:
            out[name] = value
    return out
