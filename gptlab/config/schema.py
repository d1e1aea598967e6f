"""The run schema: every config key's type and rule, read off the dataclass or the constructor that reads the key, and
checked before anything is built (the checks themselves: gptlab/util/checks.py).

A settings dataclass declares its keys as fields, the annotation the type and `rule(...)` metadata the range: RunNames
and TrainSettings the run keys (gptlab/config/settings.py), GPTConfig and MatchSettings `model.*`, Hardware
`hardware.*`; a number there must give its range. A component (attention, mlp, norm, position, data, optimizer,
schedule, each selected logger and probe) declares its keys on its `_target_`'s signature,
`eps: Annotated[float, rule("> 0")] = 1e-5`; a parameter without a rule is checked by its annotation alone (a bool, a
string, an integer, a finite number; `| None`: or null), so a variant with a new key is one .py + one .yaml. GPT's own
signature gives norm.placement, the one norm key the blocks read. `check_schema(cfg)` runs every check whose key is in
the config (sgd has `momentum`, adamw `betas`) and refuses a missing required key; each failure is one ConfigError line
naming the key, the value and what is allowed, e.g. `optimizer.lr=-1: must be > 0`. A rule's `curve=False` marks a key
that cannot change the loss curve: `curve_free_keys(cfg)` collects them for resume. Rules that relate several keys
live in gptlab/config/validate.py, once each.

Why not Hydra's ConfigStore: OmegaConf converts a typed field's value before any check sees it ('false', 1 and
'yes' become booleans, '5' an int), and the schema refuses exactly those (a quoted 'false' is a string).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import types
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

from hydra.utils import get_object
from omegaconf import OmegaConf

from gptlab.config.match import MatchSettings
from gptlab.config.settings import SEED_RANGE, RunNames, TrainSettings, config_key, is_required
from gptlab.errors import ConfigError
from gptlab.model.config import GPTConfig
from gptlab.model.gpt import GPT
from gptlab.runtime.hardware import Hardware
from gptlab.util.checks import Auto, Bool, Number, OneOf, Seq, Text
from gptlab.util.paths import CONF_DIR

Check = Number | Bool | OneOf | Text | Auto | Seq
Rule = tuple[Any, Mapping]  # (annotation, rule metadata) of one key
SEED = Number(SEED_RANGE, int)
SETTINGS = (
    (RunNames, ""),  # each field names its key
    (TrainSettings, "train"),
    (GPTConfig, "model"),
    (MatchSettings, "model"),  # model.match, match_knob, match_to (gptlab/config/match.py)
    (Hardware, "hardware"),
)
# the groups whose every key the schema knows (the component groups' keys: gptlab.config.build._check_keys)
SETTINGS_GROUPS = ("train", "sample", "model", "hardware")
COMPONENT_GROUPS = ("attention", "mlp", "norm", "position", "data", "optimizer", "schedule")
SELECTED_GROUPS = ("logger", "probes")  # a list of named choices: `<group>.<name>.<key>`
# groups that only watch or place a run (every logger key and choice, the launcher): a resume may change them
OBSERVER_GROUPS = ("logger", "launcher")


def _kinds(hint) -> tuple[list, bool]:
    """The types an annotation allows besides None, and whether it allows None: `int | None` -> ([int], True)."""
    if get_origin(hint) in (Union, types.UnionType):
        args = get_args(hint)
        return [a for a in args if a is not type(None)], type(None) in args
    return [hint], False


def _typed(hint, meta: Mapping) -> Check | None:
    """The check a type and its rule imply: bool, str, or a number in the rule's range (any without one); None for
    another type."""
    kinds, null = _kinds(hint)
    if kinds == [bool]:
        return Bool(null=null)
    if kinds == [str]:
        return Text(null=null)
    if kinds in ([int], [float]):
        return Number(meta.get("range") or "", kinds[0], null=null, note=meta.get("note") or "")
    return None


def _derived(key: str, hint, meta) -> Check:
    """A settings field's check from its annotation and rule: bool, str, or a number in the range it must give."""
    check = _typed(hint, meta)
    if check is None or (isinstance(check, Number) and not check.spec):
        raise TypeError(f"{key}: give the field rule(spec) (a number's range) or rule(check=...) for {hint}")
    return check


def _field_rules(cls: type, group: str) -> dict[str, Rule]:
    """{config key: (annotation, rule)} for every field of a settings dataclass."""
    hints = get_type_hints(cls)
    return {config_key(f, group): (hints[f.name], f.metadata) for f in fields(cls)}


def field_checks(cls: type, group: str) -> dict[str, Check]:
    """{config key: check} for every field of a settings dataclass (see gptlab.util.checks.rule)."""
    return {
        key: meta.get("check") or _derived(key, hint, meta) for key, (hint, meta) in _field_rules(cls, group).items()
    }


def _param_rules(fn: Callable, group: str | None) -> dict[str, Rule]:
    """{config key: (annotation, rule)} for the parameters of `fn`: `<group>.<name>`, or the key the rule names (with
    group None, only those); a parameter without `Annotated[T, rule(...)]` has an empty rule."""
    out: dict[str, Rule] = {}
    for name, hint in get_type_hints(fn, include_extras=True).items():
        meta: Mapping = {}
        if get_origin(hint) is Annotated:
            hint, *extras = get_args(hint)
            meta = next((m for m in extras if isinstance(m, dict) and "range" in m), {})
        key = meta.get("key") or (f"{group}.{name}" if group is not None else None)
        if name != "return" and key is not None:
            out[key] = (hint, meta)
    return out


def _param_check(key: str, hint, meta: Mapping) -> Check | None:
    """A parameter's check: its rule's own, else what its type implies (None: a type no config value has, such as a
    module or a path, so a run-time argument)."""
    check = meta.get("check") or _typed(hint, meta)
    if check is None and meta:
        raise TypeError(f"{key}: give the parameter rule(check=...) for {hint}")
    return check


def param_checks(fn: Callable, group: str | None) -> dict[str, Check]:
    """{config key: check} for every parameter of `fn` that has one (see `_param_rules`, `_param_check`)."""
    checks = {key: _param_check(key, hint, meta) for key, (hint, meta) in _param_rules(fn, group).items()}
    return {key: check for key, check in checks.items() if check is not None}


@functools.cache
def _target(target: str) -> Callable | None:
    """The callable a `_target_` names (a class: its __init__); None for one that cannot be imported."""
    try:
        obj = get_object(target)
    except Exception:  # noqa: BLE001 - an unknown target is the build step's one-line error, not the schema's
        return None
    return obj.__init__ if inspect.isclass(obj) else obj


@functools.cache
def signature_checks(group: str, target: str) -> dict[str, Check]:
    """{config key: check} for every parameter of the `_target_` callable that has one."""
    fn = _target(target)
    return param_checks(fn, group) if fn is not None else {}


def _chosen(cfg) -> list[tuple[str, str]]:
    """(group, `_target_`) of every chosen component and every selected logger and probe (`<group>.<name>`)."""
    out = []
    for group in COMPONENT_GROUPS:
        target = OmegaConf.select(cfg, f"{group}._target_")
        if isinstance(target, str):
            out.append((group, target))
    for group in SELECTED_GROUPS:
        node = OmegaConf.select(cfg, group)
        for name in node if OmegaConf.is_dict(node) else ():  # an entry without a target: validate's _unselected
            target = OmegaConf.select(cfg, f"{group}.{name}._target_")
            if isinstance(target, str):
                out.append((f"{group}.{name}", target))
    return out


def _chosen_checks(cfg) -> dict[str, Check]:
    """The signature-declared checks of every chosen component, logger and probe (a key SCHEMA has keeps its check)."""
    checks: dict[str, Check] = {}
    for group, target in _chosen(cfg):
        checks |= signature_checks(group, target)
    return {key: check for key, check in checks.items() if key not in SCHEMA}


SCHEMA: dict[str, Check] = {  # the keys every config has a place for; the chosen components' keys: _chosen_checks
    **field_checks(RunNames, ""),
    **field_checks(TrainSettings, "train"),
    **field_checks(GPTConfig, "model"),
    **field_checks(MatchSettings, "model"),
    **param_checks(GPT.__init__, None),  # norm.placement: beside the norm's keys, read by the blocks
    **field_checks(Hardware, "hardware"),  # device and dtype: Hardware names their values
}


def curve_free_keys(cfg) -> tuple[str, ...]:
    """The keys a resume may change (gptlab/state/resume.py): those whose rule says curve=False, on the settings and on
    the chosen components' signatures, and each observer group whole (`logger.`: a trailing dot is the subtree)."""
    rules = {key: meta for cls, group in SETTINGS for key, (_, meta) in _field_rules(cls, group).items()}
    for group, target in _chosen(cfg):
        fn = _target(target)
        rules |= {key: meta for key, (_, meta) in _param_rules(fn, group).items()} if fn is not None else {}
    free = (key for key, meta in rules.items() if meta.get("curve") is False)
    return (*(f"{group}." for group in OBSERVER_GROUPS), *free)


# keys every run needs (a settings field without a default, or one its rule marks required); the others are
# checked where the chosen option has them
REQUIRED = tuple(config_key(f, group) for cls, group in SETTINGS for f in fields(cls) if is_required(f))

_ABSENT = object()
RENAMED = {
    "train.eval_batches": "train.eval_sequences (the number of fixed validation sequences, whatever the batch size)"
}


def check_known_keys(group: str, node) -> None:
    """Refuse a key of `group` (train, sample, model, hardware) that the schema does not know: `+train.max_step=5`
    is a typo, and a key nothing reads would leave the run as it was without a word."""
    known = sorted(k.split(".", 1)[1] for k in SCHEMA if k.startswith(f"{group}."))
    unknown = sorted(k for k in node if not str(k).startswith("_") and k not in known)  # _target_ is Hydra's
    if unknown:
        key = f"{group}.{unknown[0]}"
        near = difflib.get_close_matches(str(unknown[0]), known, n=1)
        hint = (
            f" (renamed: use {RENAMED[key]})"
            if key in RENAMED
            else f" (did you mean {group}.{near[0]}?)"
            if near
            else ""
        )
        raise ConfigError(f"{key}: not a {group} key{hint}; allowed: {', '.join(known)}")


def root_keys(config_name: str) -> set[str]:
    """The top-level keys a primary config (conf/<name>.yaml) and the train root it builds on declare, and the groups."""
    keys = {"hydra", *(p.name for p in CONF_DIR.iterdir() if p.is_dir())}
    for name in {"train", config_name}:
        path = CONF_DIR / f"{name}.yaml"
        if path.is_file():
            keys |= _declared(path.read_text())
    return keys


@functools.lru_cache(maxsize=16)
def _declared(text: str) -> frozenset[str]:
    """The top-level keys of a YAML document but `defaults`: parsed once per text (every run checks train.yaml's)."""
    import yaml

    return frozenset(yaml.safe_load(text) or {}) - {"defaults"}


def check_root_keys(cfg) -> None:
    """Refuse a top-level key no config declares: `+seeds=3` is a typo, and a key nothing reads would leave the run
    as it was without a word."""
    name = OmegaConf.select(cfg, "hydra.job.config_name", default=None)
    if name is None:  # inside a Hydra app the config has no hydra node: ask Hydra which root it composed
        from hydra.core.hydra_config import HydraConfig

        name = HydraConfig.get().job.config_name if HydraConfig.initialized() else "train"
    known = root_keys(str(name or "train"))
    unknown = sorted(str(k) for k in cfg if str(k) not in known)
    if unknown:
        near = difflib.get_close_matches(unknown[0], sorted(known), n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ConfigError(f"{unknown[0]}: not a config key{hint}; allowed: {', '.join(sorted(known - {'hydra'}))}")


def check_schema(cfg) -> None:
    """Raise a one-line ConfigError for a key a settings group does not have, else for the first key whose value its
    check refuses (or a missing required key)."""
    check_root_keys(cfg)
    for group in SETTINGS_GROUPS:
        node = OmegaConf.select(cfg, group)
        if OmegaConf.is_dict(node):  # not a mapping at all: its required keys are missing, refused below
            check_known_keys(group, node)
    for key, check in (SCHEMA | _chosen_checks(cfg)).items():
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is _ABSENT:
            if key in REQUIRED:
                raise ConfigError(f"{key}: missing from the config (removed with ~?); it is required")
            continue
        check(key, OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value)
