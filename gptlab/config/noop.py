"""Config choices that do nothing: one-line warnings, so an ablation arm is not silently the baseline again.

Rules read config keys (n_kv_head, window, global_*, match_params, warmup_steps, min_lr_ratio), never
variant names, so a new variant that takes these keys is covered without a new rule.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def _get(cfg: Mapping, dotted: str, default: Any = None) -> Any:
    """cfg["a"]["b"] for "a.b" on a dict or DictConfig; default when any part is missing."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def _choice(choices: Mapping[str, str], group: str) -> str:
    """`attention=gqa` when the choice is known, else the bare group name."""
    return f"{group}={choices[group]}" if group in choices else group


def _heads(cfg: Mapping, choices: Mapping[str, str]) -> list[str]:
    """A grouped-KV choice whose n_kv_head equals n_head is plain multi-head attention."""
    n_head, n_kv = _get(cfg, "model.n_head"), _get(cfg, "attention.n_kv_head")
    if n_kv is None or n_head is None or n_kv != n_head or choices.get("attention") == "mha":
        return []
    return [f"{_choice(choices, 'attention')} with attention.n_kv_head={n_kv} == model.n_head={n_head} is MHA"]


def _layer_windows(cfg: Mapping) -> list[int | None]:
    """Each layer's effective window, by the model's own rule (None = full causal)."""
    from gptlab.model.attention.gqa import layer_window

    window, every, layers = (_get(cfg, f"attention.{k}") for k in ("window", "global_every", "global_layers"))
    return [layer_window(i, window, every, layers) for i in range(int(_get(cfg, "model.n_layer", 0)))]


def _windows(cfg: Mapping, choices: Mapping[str, str]) -> list[str]:
    """A window that covers the whole context, or global-layer knobs that change no layer."""
    attn = _choice(choices, "attention")
    window, block = _get(cfg, "attention.window"), _get(cfg, "model.block_size")
    every, layers = _get(cfg, "attention.global_every"), _get(cfg, "attention.global_layers")
    knobs = ", ".join(
        f"attention.{k}={v}" for k, v in (("global_every", every), ("global_layers", layers)) if v not in (None, [])
    )
    if window is None:
        if not knobs:
            return []
        return [f"{attn} with {knobs} has no effect without attention.window: every layer is full attention"]
    if block is not None and window >= block:
        return [f"{attn} with attention.window={window} >= model.block_size={block} is full attention"]
    per_layer = _layer_windows(cfg)
    if per_layer and all(w is None for w in per_layer):
        return [
            f"{attn} with {knobs} makes every one of model.n_layer={len(per_layer)} layers global: it is full attention"
        ]
    if knobs and per_layer and all(w is not None for w in per_layer):
        return [
            f"{attn} with {knobs} makes none of model.n_layer={len(per_layer)} layers global: "
            f"it is sliding-window attention (window {window}) in every layer"
        ]
    return []


def _mlp_width(cfg: Mapping, choices: Mapping[str, str]) -> list[str]:
    """match_params that rounds the 2/3 width back up to ratio·d_model changes nothing."""
    if not _get(cfg, "mlp.match_params"):
        return []
    from gptlab.model.mlp.swiglu import swiglu_hidden

    d_model, ratio, multiple = _get(cfg, "model.d_model"), _get(cfg, "mlp.ratio", 4), _get(cfg, "mlp.multiple_of", 1)
    try:
        matched = swiglu_hidden(d_model, ratio, True, multiple)
        plain = swiglu_hidden(d_model, ratio, False, multiple)
    except (TypeError, ValueError, ZeroDivisionError):
        return []  # a broken value is validation's to report, not a no-op
    if matched != plain:
        return []
    return [
        f"{_choice(choices, 'mlp')} with mlp.match_params=true is a no-op: 2/3·{ratio}·{d_model} rounds up to "
        f"mlp.multiple_of={multiple} as {matched} = mlp.ratio·model.d_model"
    ]


def _lr_curve(cfg: Mapping, max_steps: int, **change: Any) -> list[float] | None:
    """The schedule's multipliers over every step (with `change` applied); None if it cannot be built."""
    node = {k: v for k, v in dict(_get(cfg, "schedule", {})).items() if not k.startswith("_")}
    target = str(_get(cfg, "schedule._target_", ""))
    try:
        module, name = target.rsplit(".", 1)
        schedule = getattr(importlib.import_module(module), name)(max_steps=max_steps, **{**node, **change})
        return [schedule(step) for step in range(max_steps)]
    except Exception:  # noqa: BLE001 - an unbuildable schedule is validation's to report
        return None


def _schedule(cfg: Mapping, choices: Mapping[str, str]) -> list[str]:
    """A schedule that never leaves warmup, or whose decay ends where it starts, is constant in effect."""
    max_steps, warmup = _get(cfg, "train.max_steps"), _get(cfg, "schedule.warmup_steps")
    if not isinstance(max_steps, int) or max_steps < 1:
        return []
    sched = _choice(choices, "schedule")
    if isinstance(warmup, int) and warmup >= max_steps:
        return [
            f"{sched} with schedule.warmup_steps={warmup} >= train.max_steps={max_steps} never leaves warmup: "
            "its shape after warmup is never used"
        ]
    fraction = _get(cfg, "schedule.decay_fraction")
    if fraction is not None and fraction == 0:
        return [f"{sched} with schedule.decay_fraction={fraction} never decays: it is constant after warmup"]
    ratio = _get(cfg, "schedule.min_lr_ratio")
    if ratio is None or ratio == 0:
        return []
    curve, decaying = _lr_curve(cfg, max_steps), _lr_curve(cfg, max_steps, min_lr_ratio=0.0)
    if curve is None or decaying is None or curve == decaying:
        return []  # min_lr_ratio unused by this shape (constant): nothing was asked of it
    after = curve[warmup or 0 :] if isinstance(warmup, int) else curve
    if after and max(after) - min(after) < 1e-12:
        return [f"{sched} with schedule.min_lr_ratio={ratio} never decays: it is constant after warmup"]
    return []


RULES = (_heads, _windows, _mlp_width, _schedule)


def noop_choices(cfg: Mapping, choices: Mapping[str, str] | None = None) -> list[str]:
    """One line per config choice that changes nothing (e.g. GQA with n_kv_head == n_head is MHA); [] if none."""
    if choices is None:
        found = _get(cfg, "hydra.runtime.choices", {}) or {}
        choices = {str(k): str(v) for k, v in dict(found).items() if not str(k).startswith("hydra")}
    out: list[str] = []
    for rule in RULES:
        out += rule(cfg, choices)
    return out
