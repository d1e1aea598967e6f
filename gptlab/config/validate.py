"""Config checks that run before anything is built or any data is read; each failure is one line.

Keys, types and ranges of single keys are gptlab/config/schema.py's (check_schema); this module adds the rules that
relate several keys, then builds the hardware profile and the model on the meta device (their
constructors check the combination of component choices).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gptlab.config.noop import check_inert
from gptlab.config.schema import check_schema
from gptlab.errors import ConfigError
from gptlab.runtime.hardware import Hardware
from gptlab.state.layout import check_inside
from gptlab.state.resume import HF_PREFIX
from gptlab.util.extras import require


def _batch(cfg: DictConfig) -> None:
    train = cfg.train
    if train.batch_size % train.grad_accum:
        raise ConfigError(f"train.grad_accum={train.grad_accum} must divide train.batch_size={train.batch_size}")


def _is_checkpoint(path: Path) -> bool:
    """A single-file checkpoint, or a sharded (DCP) checkpoint dir."""
    return path.is_file() or (path / ".metadata").is_file()


def _checkpoints(cfg: DictConfig) -> None:
    resume = str(cfg.train.resume)
    if resume not in ("auto", "never") and not _is_checkpoint(Path(resume)):
        raise ConfigError(f"train.resume='{resume}': not auto, never, or an existing checkpoint file or .dcp dir")
    init_from = cfg.train.get("init_from")
    if init_from is not None and str(init_from).startswith(HF_PREFIX):
        if not str(init_from)[len(HF_PREFIX) :]:
            raise ConfigError(f"train.init_from='{init_from}': name a Hugging Face model after hf: (hf:gpt2, hf:DIR)")
        require("transformers", "hf", f"train.init_from={init_from}")
    elif init_from is not None and not _is_checkpoint(Path(str(init_from))):
        raise ConfigError(
            f"train.init_from='{init_from}': not an existing checkpoint file or .dcp dir, hf:<Hugging Face model> (or null)"
        )


def _attention_name(cfg: DictConfig) -> None:
    """attention=mha / gqa / mqa must be what they say (full attention; mha and mqa their KV heads): a dashboard
    grouped by choice/attention would mix in GQA or sliding windows."""
    from gptlab.config.build import group_choices

    try:
        choice = group_choices(cfg).get("attention")
    except ValueError:  # composed without Hydra's runtime config (a hand-made cfg): nothing to compare
        return
    window = OmegaConf.select(cfg, "attention.window")
    if choice in ("mha", "gqa", "mqa") and window is not None:  # else a run named mha trains sliding attention
        raise ConfigError(
            f"attention.window={window} makes attention={choice} a sliding window; allowed with {choice}: null, or "
            f"attention=sliding attention.window={window} (attention=hybrid for global layers)"
        )
    n_kv, n_head = OmegaConf.select(cfg, "attention.n_kv_head"), cfg.model.n_head
    meant = {"mha": (None, n_head), "mqa": (1,)}.get(str(choice))
    if meant is not None and n_kv not in meant:
        raise ConfigError(
            f"attention.n_kv_head={n_kv} contradicts attention={choice} (allowed: "
            f"{' or '.join('null' if m is None else str(m) for m in meant)}); for {n_kv} KV heads use attention=gqa "
            f"attention.n_kv_head={n_kv}"
        )


def _inert(cfg: DictConfig) -> None:
    """A key given on the command line that cannot act under the chosen options (gptlab/config/noop.py INERT)."""
    from gptlab.config.build import group_choices

    try:
        choices = group_choices(cfg)
    except ValueError:  # composed without Hydra's runtime config (a hand-made cfg): name the groups bare
        choices = None
    check_inert(cfg, choices)


def _logger_paths(cfg: DictConfig) -> None:
    """A logger writes inside the run dir, under its own name: never over the run's own files, the lock, or elsewhere."""
    for key in ("logger.csv.filename", "logger.tensorboard.log_dir"):
        value = OmegaConf.select(cfg, key)
        if value is not None:
            check_inside(str(value), key)


def _unselected(cfg: DictConfig) -> None:
    """`+logger.csv.filename=x` without logger=csv (or a probe's key without the probe) sets a key nothing reads."""
    for group in ("logger", "probes"):
        node = OmegaConf.select(cfg, group)
        for name in node if OmegaConf.is_dict(node) else ():
            entry = node[name]
            if OmegaConf.is_dict(entry) and "_target_" not in entry:
                key = next(iter(entry), None)
                chosen = "+".join(str(n) for n in node if OmegaConf.is_dict(node[n]) and "_target_" in node[n])
                raise ConfigError(
                    f"{group}.{name}{'.' + str(key) if key is not None else ''}: {group} {name} is not selected "
                    f"({group}={chosen or 'none'}), so nothing reads it; select it ({group}=[{name}], or add it to "
                    f"the list) or drop the key"
                )


def _global_layers(cfg: DictConfig) -> None:
    """Every listed global layer must exist: a layer index past n_layer silently changes nothing."""
    layers = OmegaConf.select(cfg, "attention.global_layers")
    n_layer = cfg.model.n_layer
    for i, layer in enumerate(layers or []):
        if layer >= n_layer:
            raise ConfigError(
                f"attention.global_layers[{i}]={layer}: no such layer; allowed: layer indices in "
                f"[0, {n_layer}) (model.n_layer={n_layer})"
            )


def _val_sets_apart(cfg: DictConfig) -> None:
    """A named val set may not hold a training file (data.paths): by resolved path here, before any file is read; by
    content when the data is built (gptlab/data/val_sets.py check_apart)."""
    paths, sets = OmegaConf.select(cfg, "data.paths"), OmegaConf.select(cfg, "data.val_sets")
    if not paths or not sets:
        return
    from gptlab.data.files import resolve_paths
    from gptlab.data.val_sets import check_apart

    try:
        files = resolve_paths(OmegaConf.to_container(paths, resolve=True) if OmegaConf.is_config(paths) else paths)
    except ConfigError:
        return  # data.paths' own error is the data's to report
    check_apart(OmegaConf.to_container(sets, resolve=True) if OmegaConf.is_config(sets) else sets, files)


def _nesterov(cfg: DictConfig) -> None:
    if OmegaConf.select(cfg, "optimizer.nesterov") and OmegaConf.select(cfg, "optimizer.momentum") == 0:
        raise ConfigError(
            "optimizer.nesterov=true needs optimizer.momentum > 0; allowed: momentum in (0, 1), "
            "or optimizer.nesterov=false"
        )


def _decay_factor(cfg: DictConfig) -> None:
    """Decoupled weight decay scales weights by 1 - lr*weight_decay per step: at >= 1 they flip sign or vanish."""
    for lr_key, decay_key in (("lr", "weight_decay"), ("adamw_lr", "adamw_weight_decay")):
        lr, decay = (OmegaConf.select(cfg, f"optimizer.{k}") for k in (lr_key, decay_key))
        if lr is not None and decay is not None and lr * decay >= 1:
            raise ConfigError(
                f"optimizer.{decay_key}={decay}: with optimizer.{lr_key}={lr} each step scales the "
                f"weights by 1 - lr*weight_decay = {1 - lr * decay:.3g}; allowed: < {1 / lr:.4g}"
            )


CROSS_RULES = (
    _batch,
    _checkpoints,
    _attention_name,
    _unselected,
    _logger_paths,
    _global_layers,
    _val_sets_apart,
    _nesterov,
    _decay_factor,
)


def validate(cfg: DictConfig) -> Hardware:
    """Check every key (schema), the rules between keys, then the model/component combination (meta device); returns
    the hardware profile built on the way, so a run constructs it once."""
    check_schema(cfg)
    for rule in CROSS_RULES:
        rule(cfg)
    _inert(cfg)
    mode = OmegaConf.select(cfg, "logger.wandb.mode")
    if mode is not None:  # W&B: a missing API key must fail now, not after the run dir is written
        from gptlab.sinks.wandb import resolve_mode

        resolve_mode(str(mode))
    from gptlab.config.build import _factory, build_hardware, build_model, build_optimizer, logger_factories

    hardware = build_hardware(cfg)
    vocab = cfg.model.get("vocab_size")
    model = build_model(cfg, vocab_size=vocab or 256, device="meta")  # component constructors check their keys
    for group in ("data", "optimizer", "schedule"):  # keys a choice's target does not take: refused, not ignored
        if OmegaConf.select(cfg, f"{group}._target_") is not None:
            _factory(cfg, group)
    if OmegaConf.select(cfg, "optimizer._target_") is not None:  # its refusals of the model (sgd under muP), now
        build_optimizer(cfg, model)
    logger_factories(cfg)
    return hardware
