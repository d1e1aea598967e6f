"""Config choices and keys that do nothing: one line each, so an ablation arm is not silently the baseline again.

Two kinds. A choice whose values make it another (GQA with n_kv_head == n_head is MHA, a window that covers the whole
context, a windowed choice with window=null): a warning. A key that cannot act under the other keys (`INERT`: a
global-layer knob without a window, mlp.multiple_of with mlp.match_params=false, a spike dump without spike
detection, sampling knobs when nothing is sampled, BPE sizes under another tokenizer, FSDP knobs without FSDP, match
knobs without model.match): a warning, and a refusal (`check_inert`, called by validate)
when the key was given on the command line, where nothing else can have meant it. A key a choice's constructor does not take at all (wsd's
decay_fraction under schedule=cosine, min_lr_ratio under schedule=constant) is refused by its signature
(gptlab/config/build.py `_check_keys`), not listed here.

Rules read config keys (n_kv_head, window, global_*, match_params, warmup_steps, min_lr_ratio, ...), never
variant names, so a new variant that takes these keys is covered without a new rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf

from gptlab.config.build import build_schedule
from gptlab.errors import ConfigError


def _get(cfg: Mapping, dotted: str, default: Any = None) -> Any:
    """cfg["a"]["b"] for "a.b" on a dict or DictConfig; default when any part is missing."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def _show(value: Any) -> str:
    """A value as an override spells it: true, null, 3."""
    return (
        {True: "true", False: "false", None: "null"}.get(value, str(value))
        if isinstance(value, (bool, type(None)))
        else str(value)
    )


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


def _choice_default(group: str, choice: str, key: str) -> Any:
    """`key` as conf/<group>/<choice>.yaml sets it (through the group's own defaults list); None where no shipped
    file of the choice sets it."""
    from gptlab.util.paths import CONF_DIR

    path = CONF_DIR / group / f"{choice}.yaml"
    if not path.is_file():
        return None
    node = OmegaConf.to_container(OmegaConf.load(path))
    if not isinstance(node, dict):
        return None
    if key in node:
        return node[key]
    parents = [d for d in node.get("defaults") or [] if isinstance(d, str) and d != "_self_" and d != choice]
    for parent in reversed(parents):  # the last default wins
        value = _choice_default(group, parent, key)
        if value is not None:
            return value
    return None


def _windows(cfg: Mapping, choices: Mapping[str, str]) -> list[str]:
    """A window that covers the whole context, global-layer knobs that change no layer, or a windowed choice whose
    window is turned off."""
    attn = _choice(choices, "attention")
    window, block = _get(cfg, "attention.window"), _get(cfg, "model.block_size")
    every, layers = _get(cfg, "attention.global_every"), _get(cfg, "attention.global_layers")
    knobs = ", ".join(
        f"attention.{k}={v}" for k, v in (("global_every", every), ("global_layers", layers)) if v not in (None, [])
    )
    if window is None:
        default = _choice_default("attention", choices["attention"], "window") if "attention" in choices else None
        if knobs or default is None:
            return []  # global-layer knobs without a window: INERT's _window_knobs
        return [
            f"{attn} with attention.window=null is full attention in every layer (no window); set attention.window "
            f"(>= 1; {attn}'s default is {default})"
        ]
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
    try:
        node = OmegaConf.create({"schedule": {**dict(_get(cfg, "schedule", {})), **change}})
        schedule = build_schedule(node, max_steps)  # the one builder, so the curve is the run's own
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

Inert = tuple[tuple[str, ...], str]  # (keys that would do nothing, why and what to do: "without attention.window...")


def _window_knobs(cfg: Mapping, choices: Mapping[str, str]) -> list[Inert]:
    """global_every / global_layers choose which layers skip the window: without a window there is none to skip."""
    if _get(cfg, "attention.window") is not None:
        return []
    knobs = tuple(
        f"attention.{k}" for k in ("global_every", "global_layers") if _get(cfg, f"attention.{k}") not in (None, [])
    )
    why = (
        f"without attention.window ({_choice(choices, 'attention')}): every layer is full attention; for global "
        "layers between windowed ones use attention=hybrid"
    )
    return [(knobs, why)] if knobs else []


def _mlp_multiple(cfg: Mapping, choices: Mapping[str, str]) -> list[Inert]:
    """multiple_of rounds the match_params (2/3) width up: with match_params=false the width is ratio·d_model as is."""
    if _get(cfg, "mlp.match_params") is not False or _get(cfg, "mlp.multiple_of") is None:
        return []
    why = "with mlp.match_params=false (the hidden width is ratio·d_model, not rounded); set mlp.match_params=true"
    return [(("mlp.multiple_of",), why)]


def _spikes(cfg: Mapping, choices: Mapping[str, str]) -> list[Inert]:
    """spike_dump and spike_window act only when spike_factor turns spike detection on."""
    if _get(cfg, "train.spike_factor") is not None:
        return []
    keys = ("train.spike_window",) + (("train.spike_dump",) if _get(cfg, "train.spike_dump") else ())
    return [(keys, "with train.spike_factor=null (spike detection off); set train.spike_factor (> 1, e.g. 3)")]


def _sampling(cfg: Mapping, choices: Mapping[str, str]) -> list[Inert]:
    """sample.temperature / top_k shape the end-of-run sample: nothing with tokens=0; top_k nothing when greedy."""
    if _get(cfg, "sample.tokens") == 0:
        keys = ("sample.temperature", "sample.top_k")
        return [(keys, "with sample.tokens=0 (no sample is drawn); set sample.tokens > 0 to draw one")]
    if _get(cfg, "sample.temperature") == 0 and _get(cfg, "sample.top_k") is not None:
        why = "with sample.temperature=0 (greedy: always the most likely token); set sample.temperature > 0"
        return [(("sample.top_k",), why)]
    return []


def _bpe(cfg: Mapping, choices: Mapping[str, str]) -> list[Inert]:
    """The BPE fit's knobs act only when the tokenizer is a fitted BPE."""
    tokenizer = _get(cfg, "data.tokenizer")
    keys = tuple(f"data.{k}" for k in ("bpe_vocab_size", "bpe_sample_bytes") if _get(cfg, f"data.{k}") is not None)
    if tokenizer in (None, "bpe") or not keys:
        return []
    return [(keys, f"with data.tokenizer={tokenizer} (settings of the BPE fit); use data.tokenizer=bpe")]


def _hardware(cfg: Mapping, choices: Mapping[str, str]) -> list[Inert]:
    """reshard_after_forward is FSDP's; tf32 is a mode of CUDA float32 matmuls."""
    out: list[Inert] = []
    strategy, distributed = _get(cfg, "hardware.strategy", "ddp"), _get(cfg, "hardware.distributed")
    if not (distributed and strategy == "fsdp"):
        why = f"without FSDP (hardware.strategy={strategy}, distributed={_show(distributed)}); use hardware=fsdp or fsdp_cpu"
        out.append((("hardware.reshard_after_forward",), why))
    if str(_get(cfg, "hardware.device", "")).startswith("cpu"):
        out.append((("hardware.tf32",), "on hardware.device=cpu (TF32 is a mode of NVIDIA GPUs' matmuls)"))
    return out


def _match_knobs(cfg: Mapping, choices: Mapping[str, str]) -> list[Inert]:
    """model.match_knob and model.match_to say how to match: with model.match=null nothing is matched."""
    if _get(cfg, "model.match") is not None:
        return []
    keys = tuple(f"model.{k}" for k in ("match_knob", "match_to") if _get(cfg, f"model.{k}") is not None)
    return [(keys, "with model.match=null (nothing is matched); set model.match=params or flops")] if keys else []


def _mup_width(cfg: Mapping, choices: Mapping[str, str]) -> list[Inert]:
    """model.mup_base_width is muP's base width: under model.parametrization=sp nothing is scaled by width."""
    if _get(cfg, "model.parametrization", "sp") == "mup" or _get(cfg, "model.mup_base_width") is None:
        return []
    return [
        (("model.mup_base_width",), "with model.parametrization=sp (nothing is scaled); set model.parametrization=mup")
    ]


INERT = (_window_knobs, _mlp_multiple, _spikes, _sampling, _bpe, _hardware, _match_knobs, _mup_width)
# keys every config carries a value for: named only when someone chose them (the command line), never by default
_ALWAYS_SET = {
    "mlp.multiple_of",
    "train.spike_window",
    "sample.temperature",
    "sample.top_k",
    "data.bpe_vocab_size",
    "data.bpe_sample_bytes",
    "hardware.reshard_after_forward",
    "hardware.tf32",
}


def _choices_of(cfg: Mapping, choices: Mapping[str, str] | None) -> Mapping[str, str]:
    """The group choices: given, else the composed config's hydra.runtime.choices."""
    if choices is not None:
        return choices
    found = _get(cfg, "hydra.runtime.choices", {}) or {}
    return {str(k): str(v) for k, v in dict(found).items() if not str(k).startswith("hydra")}


def given_keys(cfg: Mapping) -> dict[str, str]:
    """{key: the override as typed} for the command line's overrides (Hydra's overrides.task), `+`/`~` stripped."""
    task = _get(cfg, "hydra.overrides.task")
    if task is None:
        from hydra.core.hydra_config import HydraConfig

        task = HydraConfig.get().overrides.task if HydraConfig.initialized() else []
    return {str(o).lstrip("+~").split("=", 1)[0]: str(o) for o in task}


def inert_keys(cfg: Mapping, choices: Mapping[str, str] | None = None, given: Mapping[str, str] = {}) -> list[Inert]:
    """(keys, line) for each set key that cannot act under the other keys, e.g. `train.spike_dump=True has no effect
    with train.spike_factor=null ...` (a key every config carries is named only when `given`)."""
    choices = _choices_of(cfg, choices)
    out = []
    for rule in INERT:
        for keys, why in rule(cfg, choices):
            named = [k for k in keys if k not in _ALWAYS_SET or k in given]
            if named:
                shown = ", ".join(f"{k}={_show(_get(cfg, k))}" for k in named)
                out.append((tuple(named), f"{shown} {'has' if len(named) == 1 else 'have'} no effect {why}"))
    return out


def check_inert(cfg: Mapping, choices: Mapping[str, str] | None = None) -> None:
    """Refuse a key given on the command line that cannot act under the chosen options: one line naming it, the
    option that makes it inert and what to do."""
    given = given_keys(cfg)
    for keys, line in inert_keys(cfg, choices, given):
        typed = [k for k in keys if k in given]
        if typed:
            raise ConfigError(f"{line}; or drop {typed[0]}")


def noop_choices(cfg: Mapping, choices: Mapping[str, str] | None = None) -> list[str]:
    """One line per config choice that changes nothing (e.g. GQA with n_kv_head == n_head is MHA) and per set key
    that cannot act (see INERT); [] if none."""
    choices, given = _choices_of(cfg, choices), given_keys(cfg)
    out: list[str] = []
    for rule in RULES:
        out += rule(cfg, choices)
    return out + [line for _, line in inert_keys(cfg, choices, given)]


def unread_overrides(overrides: list[str], reads: tuple[str, ...], choices: tuple[str, ...] = ()) -> list[str]:
    """The overrides a tool built on conf/train.yaml never reads: keys under none of `reads` and not one of the
    groups in `choices` whose option alone it reads (gptlab-flops reads the optimizer choice, not optimizer.lr).
    hydra.* is Hydra's own, always read."""
    out = []
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        under = any(key == r or key.startswith((f"{r}.", f"{r}/")) for r in reads)
        if not (under or key in choices or key.startswith(("hydra.", "hydra/"))):
            out.append(override)
    return out
