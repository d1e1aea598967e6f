"""The run schema: every known config key with its type and range, as one table checked before anything is built
(the checks themselves: gptlab/util/checks.py).

The keys with a settings dataclass take their checks from it: the run keys from gptlab.config.settings.TrainSettings,
`model.*` from GPTConfig, `hardware.*` from Hardware (each field's annotation and `rule(...)` metadata), so each is
declared once. A component's keys (attention, mlp, norm, position, data, optimizer, schedule) come from its
`_target_`'s signature where it declares them, `eps: Annotated[float, rule("> 0")] = 1e-5` (a bool or str annotation
needs no rule), so a variant with a new key is one .py + one .yaml; the keys not yet declared that way, and the logger
keys, are listed here. `check_schema(cfg)`
runs every check whose key is in the config (sgd has `momentum`, adamw `betas`), and refuses a missing required key.
Each failure is one ConfigError line naming the key, the value and what is allowed, e.g.
`optimizer.lr=-1: must be > 0`. Cross-key rules (global layers vs n_layer, ...) live in gptlab/config/validate.py.

Why not Hydra's ConfigStore: OmegaConf converts a typed field's value before any check sees it ('false', 1 and
'yes' become booleans, '5' an int), and the schema refuses exactly those (a quoted 'false' is a string).
"""

from __future__ import annotations

import difflib
import functools
import inspect
from dataclasses import fields
from typing import Annotated, get_args, get_origin, get_type_hints

from hydra.utils import get_object
from omegaconf import OmegaConf

from gptlab.config.match import MatchSettings
from gptlab.config.settings import SEED_RANGE, TrainSettings, config_key, is_required
from gptlab.data.tokenizers import tokenizer_names
from gptlab.errors import ConfigError
from gptlab.model.attention.kernels import IMPLS
from gptlab.model.config import GPTConfig
from gptlab.runtime.hardware import Hardware
from gptlab.util.checks import Auto, Bool, Number, OneOf, Seq, Text
from gptlab.util.paths import CONF_DIR

Check = Number | Bool | OneOf | Text | Auto | Seq
SEED = Number(SEED_RANGE, int)
UNIT = Number("[0, 1)")  # dropout, betas, momentum
BETAS = Seq(UNIT, length=2)
LR = Number("> 0")
DECAY = Number(">= 0")
SETTINGS = ((TrainSettings, "train"), (GPTConfig, "model"), (Hardware, "hardware"))
# the groups whose every key the schema knows (the component groups' keys: gptlab.config.build._check_keys)
SETTINGS_GROUPS = ("train", "sample", "model", "hardware")


def _derived(key: str, hint, meta) -> Check:
    """The check a field's annotation and rule imply: bool, str, or a number in its range (`| None`: or null)."""
    kinds = [a for a in get_args(hint) if a is not type(None)] or [hint]
    null = type(None) in get_args(hint)
    if kinds == [bool]:
        return Bool(null=null)
    if kinds == [str]:
        return Text(null=null)
    if kinds in ([int], [float]) and meta.get("range"):
        return Number(meta["range"], kinds[0], null=null, note=meta.get("note", ""))
    raise TypeError(f"{key}: give the field rule(spec) (a number's range) or rule(check=...) for {hint}")


def field_checks(cls: type, group: str) -> dict[str, Check]:
    """{config key: check} for every field of a settings dataclass (see gptlab.util.checks.rule)."""
    hints = get_type_hints(cls)
    return {
        config_key(f, group): f.metadata.get("check") or _derived(config_key(f, group), hints[f.name], f.metadata)
        for f in fields(cls)
    }


COMPONENT_GROUPS = ("attention", "mlp", "norm", "position", "data", "optimizer", "schedule")


def _annotated(key: str, hint) -> Check | None:
    """The check a constructor parameter's annotation declares: Annotated[T, rule(...)], or a plain bool / str."""
    if get_origin(hint) is Annotated:
        base, *meta = get_args(hint)
        rules = [m for m in meta if isinstance(m, dict) and "range" in m]
        if rules:
            return rules[0].get("check") or _derived(key, base, rules[0])
        hint = base
    kinds = [a for a in get_args(hint) if a is not type(None)] or [hint]
    if kinds == [bool]:
        return Bool(null=type(None) in get_args(hint))
    if kinds == [str]:
        return Text(null=type(None) in get_args(hint))
    return None  # a number without a declared range: listed in SCHEMA, or unchecked


@functools.cache
def signature_checks(group: str, target: str) -> dict[str, Check]:
    """{config key: check} for every parameter of the `_target_` callable that declares one (see `_annotated`)."""
    try:
        obj = get_object(target)
        hints = get_type_hints(obj.__init__ if inspect.isclass(obj) else obj, include_extras=True)
    except Exception:  # noqa: BLE001 - an unknown target is the build step's one-line error, not the schema's
        return {}
    checks = {
        f"{group}.{name}": _annotated(f"{group}.{name}", hint) for name, hint in hints.items() if name != "return"
    }
    return {key: check for key, check in checks.items() if check is not None}


def _component_checks(cfg) -> dict[str, Check]:
    """The signature-declared checks of every chosen component (a key SCHEMA lists keeps SCHEMA's check)."""
    checks: dict[str, Check] = {}
    for group in COMPONENT_GROUPS:
        target = OmegaConf.select(cfg, f"{group}._target_")
        if isinstance(target, str):
            checks |= signature_checks(group, target)
    probes = OmegaConf.select(cfg, "probes")
    for name in probes if OmegaConf.is_dict(probes) else ():  # each probe's keys, from its signature too
        target = OmegaConf.select(cfg, f"probes.{name}._target_")
        if isinstance(target, str):
            checks |= signature_checks(f"probes.{name}", target)
    return {key: check for key, check in checks.items() if key not in SCHEMA}


SCHEMA: dict[str, Check] = {
    # run level (conf/train.yaml): the run's names, then the keys TrainSettings declares
    "sweep": Text(null=True, numbers=True),
    "name": Text(null=True, numbers=True),
    "arm": Text(null=True, numbers=True),
    **field_checks(TrainSettings, "train"),
    **field_checks(GPTConfig, "model"),
    **field_checks(MatchSettings, "model"),  # model.match, match_knob, match_to (gptlab/config/match.py)
    # components
    "attention.n_kv_head": Number(">= 1", int, null=True),
    "attention.impl": OneOf(IMPLS),
    "attention.window": Number(">= 1", int, null=True),
    "attention.global_every": Number(">= 1", int, null=True),
    "attention.global_layers": Seq(Number(">= 0", int), null=True),
    "attention.qk_norm": Bool(),
    "attention.dropout": UNIT,
    "mlp.ratio": Number("> 0"),
    "mlp.match_params": Bool(),
    "mlp.multiple_of": Number(">= 1", int),
    "mlp.dropout": UNIT,
    "norm.placement": OneOf(("pre", "post")),
    "position.base": Number("> 0"),
    "position.scale": Number("> 0"),
    # data
    "data.paths": Text(many=True),
    "data.column": Text(),
    "data.tokenizer": OneOf(tuple(tokenizer_names())),
    "data.bpe_vocab_size": Number(">= 257", int),
    "data.val_fraction": Number("(0, 1)"),
    "data.num_proc": Number(">= 1", int, null=True),
    "data.name": Text(null=True),
    "data.config_name": Text(null=True),
    "data.bpe_sample_bytes": Number(">= 1000000", int),
    "data.max_tokens": Number(">= 1", int, null=True),
    "data.verify": Bool(),
    "data.streaming": Bool(),
    "data.split": Text(),
    "data.num_keys": Number(">= 1", int),
    "data.num_values": Number(">= 1", int),
    "data.num_pairs": Number(">= 1", int),
    "data.num_queries": Number(">= 1", int),
    "data.seq_len": Number(">= 1", int),
    # optimizer (keys of the chosen optimizer only) and schedule
    "optimizer.lr": LR,
    "optimizer.betas": BETAS,
    "optimizer.weight_decay": DECAY,
    "optimizer.eps": Number("> 0"),
    "optimizer.fused": Bool(null=True),
    "optimizer.momentum": UNIT,
    "optimizer.nesterov": Bool(),
    "optimizer.adamw_lr": LR,
    "optimizer.adamw_betas": BETAS,
    "optimizer.adamw_weight_decay": DECAY,
    "schedule.warmup_steps": Number(">= 0", int),
    "schedule.min_lr_ratio": Number("[0, 1]"),
    "schedule.decay_fraction": Number("(0, 1]"),
    **field_checks(Hardware, "hardware"),  # device and dtype: Hardware names their values
    # loggers, one key each (logger.wandb.mode: gptlab.sinks.wandb.resolve_mode)
    "logger.wandb.project": Text(),
    "logger.wandb.entity": Text(null=True),
    "logger.wandb.group": Text(null=True, numbers=True),
    "logger.wandb.tags": Text(many=True),
    "logger.wandb.job_type": Text(),
    "logger.wandb.log_checkpoints": Bool(),
    "logger.tensorboard.log_dir": Text(),
    "logger.tensorboard.flush_secs": Number("> 0"),
    "logger.csv.filename": Text(),
}

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
    import yaml

    keys = {"hydra", *(p.name for p in CONF_DIR.iterdir() if p.is_dir())}
    for name in {"train", config_name}:
        path = CONF_DIR / f"{name}.yaml"
        if path.is_file():
            keys |= set(yaml.safe_load(path.read_text()) or {}) - {"defaults"}
    return keys


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
    """Raise a one-line ConfigError for a key a settings group does not have, else for the first key whose value the
    table refuses (or a missing required key)."""
    check_root_keys(cfg)
    for group in SETTINGS_GROUPS:
        node = OmegaConf.select(cfg, group)
        if OmegaConf.is_dict(node):  # not a mapping at all: its required keys are missing, refused below
            check_known_keys(group, node)
    for key, check in (SCHEMA | _component_checks(cfg)).items():
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is _ABSENT:
            if key in REQUIRED:
                raise ConfigError(f"{key}: missing from the config (removed with ~?); it is required")
            continue
        check(key, OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value)
