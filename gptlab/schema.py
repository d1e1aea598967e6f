"""The run schema: every known config key with its type and range, as one table checked before anything is built
(the checks themselves: gptlab/schema_checks.py).

`SCHEMA` maps a dotted key to a check; `check_schema(cfg)` runs every check whose key is in the config (a
group's keys vary by choice: sgd has `momentum`, adamw `betas`), and refuses a missing REQUIRED key. Each
failure is one ConfigError line naming the key, the value and what is allowed, e.g.
`optimizer.lr=-1: must be > 0`. Cross-key rules (global layers vs n_layer, ...) live in gptlab/validate.py.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from gptlab.data.tokenizers import tokenizer_names
from gptlab.errors import ConfigError
from gptlab.hardware import COMPILE_MODES, STRATEGIES
from gptlab.model.attention.kernels import IMPLS
from gptlab.schema_checks import Auto, Bool, Number, OneOf, Seq, Text

SEED = Number("[0, 2**63)", int)  # torch.manual_seed takes < 2**64; negatives alias 2**64 - n, so non-negative int64
UNIT = Number("[0, 1)")  # dropout, betas, momentum
BETAS = Seq(UNIT, length=2)
LR = Number("> 0")
DECAY = Number(">= 0")

SCHEMA: dict[str, Number | Bool | OneOf | Text | Auto | Seq] = {
    # run level (conf/train.yaml)
    "seed": SEED,
    "data_seed": SEED,
    "sweep": Text(null=True, numbers=True),
    "name": Text(null=True, numbers=True),
    "arm": Text(null=True, numbers=True),
    "profile": Bool(),
    "train.max_steps": Number(">= 1", int),
    "train.batch_size": Number(">= 1", int),
    "train.grad_accum": Number(">= 1", int),
    "train.grad_clip": Number(">= 0", note="0 = no clipping"),
    "train.eval_interval": Number(">= 1", int),
    "train.eval_sequences": Number(">= 1", int),
    "train.log_interval": Number(">= 1", int),
    "train.ckpt_interval": Number(">= 0", int, note="0 = only at the end"),
    "train.resume": Text(numbers=True),
    "train.init_from": Text(null=True),
    "train.speed_warmup": Number(">= 0", int),
    "train.nan_skip": Number(">= 0", int),
    "train.prefetch": Number(">= 0", int, note="0 = drawn in the training thread"),
    "train.diagnostics": Bool(),
    "train.spike_factor": Number("> 1", null=True, note="null = off"),
    "train.spike_window": Number(">= 2", int),
    "train.spike_dump": Bool(),
    "train.detect_anomaly": Bool(),
    "sample.tokens": Number(">= 0", int),
    "sample.temperature": Number(">= 0", note="0 = greedy"),
    "sample.top_k": Number(">= 1", int, null=True),
    # model sizes
    "model.n_layer": Number(">= 1", int),
    "model.n_head": Number(">= 1", int),
    "model.d_model": Number(">= 1", int),
    "model.block_size": Number(">= 1", int),
    "model.vocab_size": Number(">= 1", int, null=True),
    "model.tie_embeddings": Bool(),
    "model.bias": Bool(),
    "model.dropout": UNIT,
    "model.init_std": Number(">= 0"),
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
    "norm.eps": Number("> 0"),
    "norm.bias": Bool(),
    "norm.placement": OneOf(("pre", "post")),
    "position.base": Number("> 0"),
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
    # hardware (device and dtype: gptlab.hardware.Hardware names their values)
    "hardware.name": Text(),
    "hardware.device": Text(),
    "hardware.dtype": Text(),
    "hardware.tf32": Bool(),
    "hardware.compile": OneOf(COMPILE_MODES),
    "hardware.activation_checkpointing": Bool(),
    "hardware.peak_flops": Auto(Number("> 0")),
    "hardware.mem_bandwidth": Auto(Number("> 0")),
    "hardware.threads": Number(">= 1", int, null=True),
    "hardware.distributed": Bool(),
    "hardware.strategy": OneOf(STRATEGIES),
    "hardware.cpu_offload": Bool(),
    "hardware.reshard_after_forward": Bool(),
    "hardware.cpus_per_task": Number(">= 1", int, null=True),
    "hardware.tasks_per_node": Number(">= 1", int),
    "hardware.nodes": Number(">= 1", int),
    "hardware.gpus_per_node": Number(">= 0", int, null=True),
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

# keys every run needs; the others are checked where the chosen option has them
REQUIRED = (
    "seed",
    "data_seed",
    *(k for k in SCHEMA if k.startswith(("train.", "sample.")) and k != "train.init_from"),
    "model.n_layer",
    "model.n_head",
    "model.d_model",
    "model.block_size",
    "model.dropout",
    "model.init_std",
)
_ABSENT = object()


def check_schema(cfg) -> None:
    """Raise a one-line ConfigError for the first key whose value the table refuses (or a missing required key)."""
    for key, check in SCHEMA.items():
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is _ABSENT:
            if key in REQUIRED:
                raise ConfigError(f"{key}: missing from the config (removed with ~?); it is required")
            continue
        check(key, OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value)
