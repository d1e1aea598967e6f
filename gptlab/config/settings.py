"""TrainSettings: the run keys of conf/train.yaml the loop reads, as one dataclass that is also their schema.

Each field is one config key (`train.<field>` unless its `rule(key=...)` names another: seeds, sampling, profiling),
with its type (the annotation) and its allowed range (the `rule`); gptlab/config/schema.py derives the key's check from it,
and `train_settings(cfg)` fills it from a validated config. A field whose rule says `curve=False` cannot change the
loss curve, so a resume may change it (gptlab/config/schema.py `curve_free_keys`). RunNames declares the run's names
the same way. The values and their comments live in conf/train.yaml.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, field, fields
from typing import cast

from omegaconf import DictConfig, OmegaConf

from gptlab.errors import ConfigError
from gptlab.util.checks import Number, Seq, Text, rule

_ABSENT = object()
SEED_RANGE = "[0, 2**63)"  # torch.manual_seed takes < 2**64; negatives alias 2**64 - n, so non-negative int64
NAME = Text(null=True, numbers=True)  # name=123 is a name too


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
    # curve=False: how often it logs and saves, where it starts from, how batches are drawn, never the curve itself
    log_interval: int = field(metadata=rule(">= 1", curve=False))
    ckpt_interval: int = field(metadata=rule(">= 0", note="0 = only at the end", curve=False))
    resume: str = field(metadata=rule(check=Text(numbers=True), curve=False))  # auto | never | a checkpoint path
    init_from: str | None = field(metadata=rule(required=False, curve=False))  # a checkpoint to start a new run from
    speed_warmup: int = field(metadata=rule(">= 0"))
    nan_skip: int = field(metadata=rule(">= 0"))
    prefetch: int = field(metadata=rule(">= 0", note="0 = drawn in the training thread", curve=False))
    # observers: they measure, warn or replay, never change a step
    diagnostics: bool = field(metadata=rule(curve=False))  # per-layer norms, update ratios, ... (train.diagnostics)
    spike_factor: float | None = field(metadata=rule("> 1", note="null = off", curve=False))  # loss > factor x median
    spike_window: int = field(metadata=rule(">= 2", curve=False))
    spike_dump: bool = field(metadata=rule(curve=False))
    detect_anomaly: bool = field(metadata=rule(curve=False))  # replay a non-finite step to name its first op
    # the end-of-run sample and the profiler: after or beside training (profiled steps restore the weights)
    sample_tokens: int = field(metadata=rule(">= 0", key="sample.tokens", curve=False))
    sample_temperature: float = field(metadata=rule(">= 0", note="0 = greedy", key="sample.temperature", curve=False))
    sample_top_k: int | None = field(metadata=rule(">= 1", key="sample.top_k", curve=False))
    profile: bool = field(metadata=rule(key="profile", curve=False))
    # a sweep's shared FLOPs grid: also evaluate at the steps around each cumulative-FLOPs value, so every arm is read
    # at the same FLOPs between evals one step apart (gptlab-compare's equal-FLOPs view), not across a long chord
    eval_flops: list[float] | None = field(default=None, metadata=rule(check=Seq(Number("> 0"), null=True)))


@dataclass
class RunNames:
    """The run's names (conf/train.yaml's root keys): the sweep, the run and its arm, for dashboards and run dirs."""

    sweep: str | None = field(default=None, metadata=rule(check=NAME, key="sweep", curve=False))
    name: str | None = field(default=None, metadata=rule(check=NAME, key="name", curve=False))
    arm: str | None = field(default=None, metadata=rule(check=NAME, key="arm", curve=False))


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
