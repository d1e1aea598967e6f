"""Config checks that run before anything is built or any data is read; each failure is one line."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gptlab.errors import ConfigError

# key -> (type, minimum); minimum None = no bound
RUN_KEYS = {
    "train.max_steps": (int, 1), "train.batch_size": (int, 1), "train.grad_accum": (int, 1),
    "train.eval_interval": (int, 1), "train.eval_sequences": (int, 1), "train.log_interval": (int, 1),
    "train.ckpt_interval": (int, 0), "train.speed_warmup": (int, 0), "train.nan_skip": (int, 0),
    "train.grad_clip": (float, 0), "seed": (int, None), "data_seed": (int, None),
    "model.n_layer": (int, 1), "model.n_head": (int, 1), "model.d_model": (int, 1), "model.block_size": (int, 1),
    "model.init_std": (float, 0), "sample.tokens": (int, 0), "sample.temperature": (float, 0),
}


TRAIN_KEYS = sorted({k.split(".")[1] for k in RUN_KEYS if k.startswith("train.")} | {"resume", "init_from"})
RENAMED = {"eval_batches": "train.eval_sequences (the number of fixed validation sequences, whatever the batch size)"}


def _get(cfg: DictConfig, key: str):
    node = cfg
    for part in key.split("."):
        if part not in node:
            raise ConfigError(f"{key}: missing from the config (removed with ~?); it is required")
        node = node[part]
    return node


def check_number(key: str, value, kind: type, minimum) -> None:
    """Raise a one-line ConfigError unless value is a `kind` >= minimum."""
    is_bool = isinstance(value, bool)
    ok_type = (isinstance(value, int) and not is_bool) if kind is int else (isinstance(value, (int, float)) and not is_bool)
    if not ok_type:
        raise ConfigError(f"{key}={value!r}: expected {'an integer' if kind is int else 'a number'}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{key}={value}: must be >= {minimum}")


def validate(cfg: DictConfig) -> None:
    """Check run-level keys and the model/component combination (by building it on the meta device)."""
    for key, (kind, minimum) in RUN_KEYS.items():
        check_number(key, _get(cfg, key), kind, minimum)
    train = cfg.train
    unknown = sorted(set(train) - set(TRAIN_KEYS))
    if unknown:
        hint = f" (renamed: use {RENAMED[unknown[0]]})" if unknown[0] in RENAMED else ""
        raise ConfigError(f"train.{unknown[0]}: not a train key{hint}; allowed: {', '.join(TRAIN_KEYS)}")
    if train.batch_size % train.grad_accum:
        raise ConfigError(f"train.grad_accum={train.grad_accum} must divide train.batch_size={train.batch_size}")
    resume = str(train.resume)
    if resume not in ("auto", "never") and not Path(resume).is_file():
        raise ConfigError(f"train.resume='{resume}': not auto, never, or an existing checkpoint file")
    init_from = train.get("init_from")
    if init_from is not None and not Path(str(init_from)).is_file():
        raise ConfigError(f"train.init_from='{init_from}': not an existing checkpoint file (or null)")
    vocab = cfg.model.get("vocab_size")
    if vocab is not None:
        check_number("model.vocab_size", vocab, int, 1)
    check_number("model.dropout", _get(cfg, "model.dropout"), float, 0)
    if not cfg.model.dropout < 1.0:
        raise ConfigError(f"model.dropout={cfg.model.dropout}: must be in [0, 1)")
    mode = OmegaConf.select(cfg, "logger.mode")
    if mode is not None:  # W&B: a missing API key must fail now, not after the run dir is written
        from gptlab.sinks.wandb import resolve_mode

        resolve_mode(str(mode))
    from gptlab.build import build_hardware, build_model

    build_hardware(cfg)
    build_model(cfg, vocab_size=vocab or 256, device="meta")  # component constructors check their keys
