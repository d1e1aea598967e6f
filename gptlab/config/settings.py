"""TrainSettings: the run keys of conf/train.yaml the loop reads, as one dataclass that is also their schema.

Each field is one config key (`train.<field>` unless its `rule(key=...)` names another: seeds, sampling, profiling),
with its type (the annotation) and its allowed range (the `rule`); gptlab/config/schema.py derives the key's check from it,
and `train_settings(cfg)` fills it from a validated config. The values and their comments live in conf/train.yaml.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, field, fields
from typing import cast

from omegaconf import DictConfig, OmegaConf

from gptlab.errors import ConfigError
from gptlab.util.checks import Text, rule

_ABSENT = object()
SEED_RANGE = "[0, 2**63)"  # torch.manual_seed takes < 2**64; negatives alias 2**64 - n, so non-negative int64


@dataclass
class TrainSettings:
    """Run-level plain values the loop needs (cfg.train plus seeds, sampling and profiling)."""

    seed: int = field(metadata=rule(SEED_RANGE, key="seed"))  # model init and dropout
    data_seed: int = field(metadata=rule(SEED_RANGE, key="data_seed"))  # data order and the fixed validation batches
    max_steps: int = field(metadata=rule(">= 1"))
    batch_size: int = field(metadata=rule(">= 1"))
    grad_accum: int = field(metadata=rule(">= 1"))
    grad_clip: float = field(metadata=rule(">= 0", note="0 = no clipping"))
    eval_interval: int = field(metadata=rule(">= 1"))
    eval_sequences: int = field(metadata=rule(">= 1"))
    log_interval: int = field(metadata=rule(">= 1"))
    ckpt_interval: int = field(metadata=rule(">= 0", note="0 = only at the end"))
    resume: str = field(metadata=rule(check=Text(numbers=True)))  # auto | never | a checkpoint path
    init_from: str | None = field(metadata=rule(required=False))  # a checkpoint to start a new run from
    speed_warmup: int = field(metadata=rule(">= 0"))
    nan_skip: int = field(metadata=rule(">= 0"))
    prefetch: int = field(metadata=rule(">= 0", note="0 = drawn in the training thread"))
    diagnostics: bool  # per-layer norms, update ratios, activations, attention stats (gptlab.train.diagnostics)
    spike_factor: float | None = field(metadata=rule("> 1", note="null = off"))  # loss > factor x running median
    spike_window: int = field(metadata=rule(">= 2"))
    spike_dump: bool
    detect_anomaly: bool  # replay a non-finite step to name its first op (gptlab.train.anomaly)
    sample_tokens: int = field(metadata=rule(">= 0", key="sample.tokens"))
    sample_temperature: float = field(metadata=rule(">= 0", note="0 = greedy", key="sample.temperature"))
    sample_top_k: int | None = field(metadata=rule(">= 1", key="sample.top_k"))
    profile: bool = field(metadata=rule(key="profile"))


def config_key(f, group: str) -> str:
    """The dotted config key of a settings dataclass field: its rule's `key`, else `<group>.<field>`."""
    return f.metadata.get("key") or f"{group}.{f.name}"


def is_required(f: Field) -> bool:
    """Whether the config must have this field's key: its rule says so, else when the field has no default."""
    said = f.metadata.get("required")
    return (f.default is MISSING and f.default_factory is MISSING) if said is None else said


def train_settings(cfg: DictConfig) -> TrainSettings:
    """TrainSettings from a validated config, each field read from its key (an optional key absent: None)."""
    values = {}
    for f in fields(TrainSettings):
        key = config_key(f, "train")
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is _ABSENT and is_required(f):  # never a silent None where check_schema was skipped
            raise ConfigError(f"{key}: missing from the config (removed with ~?); it is required")
        value = None if value is _ABSENT else value
        values[f.name] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    return TrainSettings(**cast(dict, values))
