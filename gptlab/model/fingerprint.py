"""A fingerprint of a model as built: two models with the same fingerprint are the same experiment."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import torch.nn as nn

PLAIN = (int, float, str, bool, type(None))
IGNORED = {"training", "activation_checkpointing"}  # switches that change speed or memory, never the function


def _hyper_parameters(module: nn.Module) -> dict:
    """A module's own plain attributes (n_head, window, impl, eps, p, ...), the effective values after __init__."""
    out: dict[str, Any] = {}
    for key, value in sorted(vars(module).items()):
        if key.startswith("_") or key in IGNORED:
            continue
        if isinstance(value, PLAIN) or (isinstance(value, (tuple, list)) and all(isinstance(v, PLAIN) for v in value)):
            out[key] = list(value) if isinstance(value, (tuple, list)) else value
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):  # GPTConfig: init_std, dropout, ...
            out[key] = _fields(value)
    return out


def _fields(value) -> dict:
    """A dataclass's fields, less each one marked `omit_default` while at its default: a key added after runs recorded
    their fingerprints (model.parametrization) leaves the models built without it as they were (timing rebuilds them)."""
    out = dataclasses.asdict(value)
    for f in dataclasses.fields(value):
        if f.metadata.get("omit_default") and getattr(value, f.name) == f.default:
            del out[f.name]
    return out


def describe(model: nn.Module) -> list:
    """What the fingerprint hashes: per module its class and hyper-parameters, per tensor its shape and dtype."""
    parts: list = [
        [name, type(m).__module__ + "." + type(m).__qualname__, _hyper_parameters(m)]
        for name, m in model.named_modules()
    ]
    parts += [[name, list(p.shape), str(p.dtype), p.requires_grad] for name, p in model.named_parameters()]
    parts += [[name, list(b.shape), str(b.dtype)] for name, b in model.named_buffers()]
    return parts


def model_fingerprint(model: nn.Module) -> str:
    """16 hex digits of sha256 over describe(model); works on the meta device (shapes only, no values)."""
    text = json.dumps(describe(model), sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
