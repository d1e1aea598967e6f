"""model.match: an arm re-solves one size knob so that its cost equals its baseline's (matched arms).

`model.match: params` holds the non-embedding parameter count, `flops` the training FLOPs per token of the cost model
(gptlab/costs/, the MFU numerator, at a sequence of model.block_size tokens) equal to the BASELINE's, by re-solving
`model.match_knob`: `mlp` (the MLP hidden width, through mlp.ratio; the default), `d_model` (in steps of 2·n_head: an
even head dim) or `n_layer`. The chosen value is the grid value whose cost is nearest the baseline's, so the residual
is at most one rounding step (the cost between the two grid values around the target).

The baseline is computed inside the run, from its own config alone (so it works under sweeps and SLURM): the run's
config with its component groups (attention, mlp, norm, position) replaced by conf/train.yaml's default choices of
them (mha, gelu at ratio 4, rmsnorm, rope), composed with `model.match_to` (Hydra overrides of those four groups,
e.g. `[norm=layernorm, position=learned]` for GPT-2's own blocks) when given. Everything else, model sizes included
(at their configured values), is the run's own.

Refused in one line: no knob value within range reaches the baseline's cost, a knob the arm cannot move (mlp=none has
no hidden width), a match_to override outside the four groups, and a match that turns the arm into its baseline (an
mlp.ratio arm matched on the MLP width: pick d_model or n_layer). A depth that breaks a hybrid's global layers (none
left, every layer global, or a listed layer past the last) counts as one that does not build: it is never chosen, and
where only such depths reach the baseline the match is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from gptlab.errors import ConfigError
from gptlab.util.checks import OneOf, Text, rule

MODES = ("params", "flops")
KNOBS = ("mlp", "d_model", "n_layer")
COMPONENTS = ("attention", "mlp", "norm", "position")
MAX_FACTOR = 16  # d_model and n_layer are searched up to 16x their configured value, the MLP width up to 64·d_model
MAX_RATIO = 64


@dataclass(frozen=True)
class MatchSettings:
    """The model.match* keys (the schema of these three `model.*` keys; the GPT itself never sees them)."""

    match: str | None = field(default=None, metadata=rule(check=OneOf((None, *MODES))))
    # null = mlp: the key's absence (a run from before it existed) and its default are one config, so resume agrees
    match_knob: str | None = field(default=None, metadata=rule(check=OneOf((None, *KNOBS))))
    match_to: list[str] | None = field(default=None, metadata=rule(check=Text(null=True, many=True)))


KEYS = tuple(MatchSettings.__dataclass_fields__)


@dataclass(frozen=True)
class Costs:
    """What matching compares of one sizing: non-embedding params, training FLOPs per token, the model fingerprint
    and the MLP hidden width of its first block (None without an MLP)."""

    params: int
    flops: float
    fingerprint: str
    hidden: int | None


Measure = Callable[[DictConfig], Costs]  # sizing config (model + the four components) -> its costs
Defaults = Callable[[list[str]], DictConfig]  # match_to overrides -> a composed config holding the four components


def settings(cfg: DictConfig) -> MatchSettings:
    """The run's model.match* keys."""
    node = cfg.get("model") or {}
    to = node.get("match_to")
    return MatchSettings(
        match=node.get("match"),
        match_knob=node.get("match_knob") or "mlp",
        match_to=[to] if isinstance(to, str) else (list(to) if to is not None else None),
    )


def _copy(node: DictConfig) -> DictConfig:
    return cast(DictConfig, OmegaConf.create(OmegaConf.to_container(node)))


def sizing(cfg: DictConfig) -> DictConfig:
    """What sizes the model, as a plain (resolved, writable) config: model + attention, mlp, norm, position."""
    return OmegaConf.create({k: OmegaConf.to_container(cfg[k], resolve=True) for k in ("model", *COMPONENTS)})


def _unmatched(cfg: DictConfig) -> DictConfig:
    out = _copy(cfg)
    out.model.match = None
    return out


def check_match_to(overrides: list[str]) -> None:
    """Each model.match_to item overrides one of the four component groups (a choice or a key of it), each key once
    (two values for one key would leave the baseline to whichever came last)."""
    seen: dict[str, str] = {}
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if "=" not in item or key.split(".", 1)[0] not in COMPONENTS or key.startswith(("+", "~")):
            raise ConfigError(
                f"model.match_to: {item!r} is not allowed; allowed: overrides of the baseline's "
                f"{', '.join(COMPONENTS)} (e.g. norm=layernorm, mlp.ratio=4)"
            )
        if key in seen:
            raise ConfigError(f"model.match_to: {key} is given twice ({seen[key]!r}, {item!r}); give each key once")
        seen[key] = item


def baseline(cfg: DictConfig, s: MatchSettings, defaults: Defaults) -> DictConfig:
    """The baseline's sizing: this run's model sizes with the default (+ match_to) attention, mlp, norm, position."""
    check_match_to(s.match_to or [])
    composed = defaults(list(s.match_to or []))
    base = _unmatched(sizing(cfg))
    for group in COMPONENTS:
        base[group] = OmegaConf.to_container(composed[group], resolve=True)
    return base


@dataclass(frozen=True)
class Grid:
    """The knob's reachable values (a range) and how one is written into a sizing config."""

    key: str
    values: range
    what: str  # the knob in words, for messages

    def apply(self, cfg: DictConfig, index: int) -> DictConfig:
        out = _copy(cfg)
        v = self.values[index]
        if self.key == "mlp.ratio":
            out.mlp.ratio = v / int(cfg.model.d_model)  # a width of exactly v: round(v / d · d) = v
        else:
            OmegaConf.update(out, self.key, v)
        return out

    def setting(self, cfg: DictConfig, index: int) -> float | int:
        """The config value index stands for (mlp.ratio, model.d_model or model.n_layer)."""
        return cast(float | int, OmegaConf.select(self.apply(cfg, index), self.key))


def grid(cfg: DictConfig, knob: str) -> Grid:
    """The reachable values of `knob` for this sizing."""
    d, n_head, n_layer = int(cfg.model.d_model), int(cfg.model.n_head), int(cfg.model.n_layer)
    if knob == "mlp":
        if "ratio" not in cfg.mlp:
            target = str(cfg.mlp.get("_target_", "?")).rsplit(".", 1)[-1]
            raise ConfigError(
                f"model.match_knob=mlp: this mlp choice ({target}) has no hidden width to solve (no mlp.ratio key); "
                "allowed: model.match_knob=d_model or n_layer"
            )
        return Grid("mlp.ratio", range(1, MAX_RATIO * d + 1), "the MLP hidden width")
    if knob == "d_model":
        step = 2 * n_head
        return Grid("model.d_model", range(step, MAX_FACTOR * d + step, step), f"model.d_model (steps of {step})")
    return Grid("model.n_layer", range(1, MAX_FACTOR * n_layer + 1), "model.n_layer")


def _layout(cfg: DictConfig) -> str | None:
    """What this sizing's model.n_layer does to a hybrid's global layers (attention.window with global_every or
    global_layers), in words, where it breaks them: a listed layer past the last, no global layer (sliding-window
    attention in every layer) or every layer global (full attention); None where windowed and global layers both stay."""
    from gptlab.model.attention.gqa import layer_window

    window, every, layers = (
        OmegaConf.select(cfg, f"attention.{k}") for k in ("window", "global_every", "global_layers")
    )
    if window is None or (every is None and not layers):
        return None
    n = int(cfg.model.n_layer)
    knobs = ", ".join(f"attention.{k}={v}" for k, v in (("global_every", every), ("global_layers", layers)) if v)
    per_layer = [layer_window(i, window, every, layers) for i in range(n)]
    if all(w is not None for w in per_layer):
        return f"model.n_layer={n} leaves no global layer ({knobs}): sliding-window attention in every layer"
    if all(w is None for w in per_layer):
        return f"model.n_layer={n} makes every layer global ({knobs}): full attention"
    past = [layer for layer in layers or [] if layer >= n]
    return f"model.n_layer={n} has no layer {past[0]} ({knobs})" if past else None


def _cost(measure: Measure, cfg: DictConfig, mode: str) -> float | None:
    """The sizing's params or FLOPs/token; None where the sizing does not build (below a feasible knob value)."""
    try:
        return float(getattr(measure(cfg), mode))
    except ConfigError:
        return None


def _keeping_layout(measure: Measure) -> Measure:
    """measure, refusing (as a sizing that does not build) a depth that breaks the global layers (_layout)."""

    def checked(cfg: DictConfig) -> Costs:
        why = _layout(cfg)
        if why is not None:
            raise ConfigError(why)
        return measure(cfg)

    return checked


def _first_at_or_above(g: Grid, cfg: DictConfig, measure: Measure, mode: str, target: float) -> int:
    """The smallest grid index whose cost is >= target (costs grow with the knob); len(values) when none is."""
    lo, hi = 0, len(g.values)
    while lo < hi:
        mid = (lo + hi) // 2
        cost = _cost(measure, g.apply(cfg, mid), mode)
        if cost is not None and cost >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _words(mode: str, value: float) -> str:
    return f"{value:,.0f} non-embedding params" if mode == "params" else f"{value:.4g} training FLOPs/token"


def solve(cfg: DictConfig, s: MatchSettings, measure: Measure, defaults: Defaults) -> tuple[DictConfig, dict]:
    """The sizing with the knob re-solved, and the record of it (summary.json `match`)."""
    assert s.match is not None
    knob = s.match_knob or "mlp"
    own = _unmatched(sizing(cfg))
    base = baseline(cfg, s, defaults)
    base_costs, own_costs = measure(base), measure(own)
    target = float(getattr(base_costs, s.match))
    g = grid(own, knob)
    if knob == "n_layer" and _layout(own) is None:  # a depth that breaks the hybrid's global layers does not build
        measure = _keeping_layout(measure)
    i = _first_at_or_above(g, own, measure, s.match, target)
    above = _cost(measure, g.apply(own, i), s.match) if i < len(g.values) else None
    below = _cost(measure, g.apply(own, i - 1), s.match) if i > 0 else None
    found = [(j, c) for j, c in ((i - 1, below), (i, above)) if c is not None]
    if not found:
        raise ConfigError(f"model.match={s.match}: no value of {g.what} builds for this model")
    chosen, cost = min(found, key=lambda jc: (abs(jc[1] - target), jc[0]))  # the nearest; a tie to the smaller
    other = next((c for j, c in found if j != chosen), None)
    step = abs(cost - other) if other is not None else None
    if other is None and cost != target:  # the target lies outside what the knob's range reaches
        end = "largest" if above is None else "smallest that builds"
        why = _layout(g.apply(own, i - 1)) if knob == "n_layer" and above is not None and i > 0 else None
        raise ConfigError(
            f"model.match={s.match}: no {g.what} in [{g.values[0]}, {g.values[-1]}] gives the baseline's "
            f"{_words(s.match, target)} (the {end} gives {_words(s.match, cost)}"
            f"{'; below it, ' + why if why else ''}); allowed: another "
            "model.match_knob, or an arm nearer the baseline"
        )
    resolved = g.apply(own, chosen)
    got = measure(resolved)
    if got.fingerprint == base_costs.fingerprint and own_costs.fingerprint != base_costs.fingerprint:
        raise ConfigError(
            f"model.match={s.match} with model.match_knob={knob} re-solves this arm into its baseline (the "
            f"knob is the arm's own change); allowed: another model.match_knob ({', '.join(k for k in KNOBS if k != knob)})"
        )
    residual = cost - target
    record: dict[str, Any] = {
        "mode": s.match,
        "knob": knob,
        "key": g.key,
        "configured": OmegaConf.select(own, g.key),
        "resolved": g.setting(own, chosen),
        "mlp_hidden": got.hidden,
        "target": target,
        "achieved": cost,
        "residual": residual,
        "residual_pct": 100.0 * residual / target if target else None,
        "step": step,
        "params_non_embedding": got.params,
        "flops_per_token": got.flops,
        "baseline": {
            "match_to": list(s.match_to or []),
            "components": {k: OmegaConf.to_container(base[k]) for k in COMPONENTS},
            "is_self": own_costs.fingerprint == base_costs.fingerprint,
        },
    }
    return resolved, record


_CACHE: dict[tuple, tuple[DictConfig, dict | None]] = {}


def resolve(cfg: DictConfig, measure: Measure, defaults: Defaults, key: Any = None) -> tuple[DictConfig, dict | None]:
    """(the sizing config the model is built from, the match record or None); cached per (sizing, key)."""
    s = settings(cfg)
    if s.match is None:
        return cfg, None
    cache_key = (OmegaConf.to_yaml(sizing(cfg)), key)
    if cache_key not in _CACHE:
        _CACHE[cache_key] = solve(cfg, s, measure, defaults)
    resolved, record = _CACHE[cache_key]
    return _copy(resolved), dict(record) if record else None


def describe(record: dict) -> str:
    """One line: what was matched, the knob's resolved value and the residual mismatch."""
    unit = "params" if record["mode"] == "params" else "FLOPs/token"
    hidden = f", MLP hidden {record['mlp_hidden']}" if record["knob"] == "mlp" and record.get("mlp_hidden") else ""
    pct = record.get("residual_pct")
    step = record.get("step")
    return (
        f"{record['mode']} matched to the baseline by {record['key']} {record['configured']:g} -> "
        f"{record['resolved']:g}{hidden}: residual {record['residual']:+,.0f} {unit}"
        + (f" ({pct:+.3f}%)" if pct is not None else "")
        + (f", one rounding step = {step:,.0f}" if step else "")
    )
