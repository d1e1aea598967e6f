"""The one place that turns a composed config into objects (the only caller of hydra.utils.instantiate)."""

from __future__ import annotations

import copy
import difflib
import functools
import hashlib
import inspect
import os
from collections import OrderedDict
from typing import Any, cast

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from gptlab.config import match, resolvers  # noqa: F401  (resolvers: registers those conf/train.yaml uses)
from gptlab.config.schema import check_known_keys
from gptlab.costs.report import train_flops_per_token
from gptlab.data import default_cache_dir
from gptlab.errors import ConfigError
from gptlab.model.config import GPTConfig
from gptlab.model.gpt import GPT
from gptlab.runtime.hardware import Hardware
from gptlab.state.layout import check_cache
from gptlab.util.extras import require
from gptlab.util.paths import CONF_DIR, SWEEP_RUN_GROUP

# compose()'s results in this process, newest last: (config, the search path's extra folders, their digest). A sweep
# composes each of its runs several times (plan, run identity, launch), a test suite the same runs in many tests, and
# a Hydra compose costs ~90 ms against ~5 ms for a copy.
_COMPOSED: OrderedDict[tuple, tuple[DictConfig, list[str], str]] = OrderedDict()
_COMPOSED_MAX = 128


def compose(overrides: list[str] | None = None, config_name: str = "train") -> DictConfig:
    """Compose the real Hydra config from conf/ (with hydra.runtime.choices), outside of @hydra.main.

    The same call again returns a copy of the first result while nothing it was composed from has changed: the
    config name, the overrides, the working directory (hydra.runtime.cwd) and the bytes of every file under conf/
    and under each file:// folder of the config's search path (hydra.searchpath), so an edited YAML file composes
    anew. The copy is unresolved, as a fresh compose is (${now:} and the run dir's uid resolve per copy), and each
    caller may change its own."""
    overrides = list(overrides or [])
    key = (config_name, tuple(overrides), os.getcwd(), _digest([str(CONF_DIR)]))
    kept = _COMPOSED.get(key)
    if kept is not None and _digest(kept[1]) == kept[2]:
        _COMPOSED.move_to_end(key)
        return copy.deepcopy(kept[0])
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = hydra_compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    folders = _search_folders(cfg)
    digest = _digest(folders) if folders is not None and key[-1] is not None else None
    if folders is not None and digest is not None:
        _COMPOSED[key] = (copy.deepcopy(cfg), folders, digest)
        _COMPOSED.move_to_end(key)  # a stale entry replaced keeps its place otherwise
        while len(_COMPOSED) > _COMPOSED_MAX:
            _COMPOSED.popitem(last=False)
    return cfg


def _search_folders(cfg: DictConfig) -> list[str] | None:
    """The folders hydra.searchpath adds; None unless each entry is a plain absolute file:// path (not pkg://, not
    relative, not an interpolation such as ${oc.env:...}, whose folder the key could not pin down)."""
    entries = OmegaConf.select(cfg, "hydra.searchpath")
    folders = []
    for entry in cast(list, OmegaConf.to_container(entries, resolve=False)) if entries else []:
        path = str(entry).removeprefix("file://")
        if path == str(entry) or "${" in path or not os.path.isabs(path):
            return None
        folders.append(path)
    return folders


def _digest(folders: list[str], most: int = 1000) -> str | None:
    """A digest of the path and bytes of every file under the folders (~1 ms for conf/'s ~70); None past `most`
    files (a search path on a whole project: reading it would cost more than composing)."""
    digest, seen = hashlib.blake2b(digest_size=16), 0
    for folder in folders:
        for root, dirs, files in os.walk(folder):
            dirs.sort()
            seen += len(files)
            if seen > most:
                return None
            for name in sorted(files):
                path = os.path.join(root, name)
                if not os.path.isfile(path):  # a FIFO, a dangling link: nothing Hydra loads
                    continue
                try:
                    with open(path, "rb") as f:
                        digest.update(path.encode() + b"\0" + f.read() + b"\0")
                except OSError:  # unreadable: Hydra says so when it matters, and nothing is kept
                    return None
    return digest.hexdigest()


def group_choices(cfg: DictConfig) -> dict[str, str]:
    """The option picked in each config group, e.g. {"attention": "gqa", ...} (hydra/* groups left out)."""
    choices = OmegaConf.select(cfg, "hydra.runtime.choices")
    if choices is None:
        from hydra.core.hydra_config import HydraConfig

        choices = HydraConfig.get().runtime.choices
    out = {
        k: str(v) for k, v in choices.items() if not k.startswith("hydra") and k != SWEEP_RUN_GROUP and v is not None
    }  # unset: no choice
    if "logger" in out or cfg.get("logger"):  # a list-valued group has no runtime choice: name what is selected
        out["logger"] = "+".join(cfg.get("logger") or {}) or "none"
    if "probes" in out or cfg.get("probes"):  # the same for the probes (probes=recall is recorded, [recall] not)
        out["probes"] = "+".join(cfg.get("probes") or {}) or "none"
    return out


def _factory(cfg: DictConfig, group: str, drop: tuple[str, ...] = ()):
    """instantiate(cfg.<group>) minus run-level keys; a key the choice's target does not take is a ConfigError."""
    node = cast(dict, OmegaConf.to_container(cfg[group], resolve=True))
    for key in drop:
        node.pop(key, None)
    made = instantiate(node)
    if isinstance(made, functools.partial):
        _check_keys(group, made)
    return made


def _check_keys(group: str, factory: functools.partial) -> None:
    """Refuse config keys the factory cannot take, before anything is built: `attention.widnow=4` is a typo."""
    params = inspect.signature(factory.func).parameters
    if any(p.kind is p.VAR_KEYWORD and not p.name.startswith("_") for p in params.values()):
        return  # **kwargs passed on; a `**_ignored` catch-all (a sink's run-time extras) reads no config key
    unknown = sorted(set(factory.keywords) - set(params))
    if unknown:
        keys = [k for k, p in params.items() if p.kind is p.KEYWORD_ONLY or p.default is not p.empty]
        near = difflib.get_close_matches(unknown[0], keys, n=1)
        hint = f" (did you mean {group}.{near[0]}?)" if near else ""
        raise ConfigError(
            f"{group}.{unknown[0]}: not a key of this {group} choice ({factory.func.__name__}){hint}; "
            f"allowed: {', '.join(keys)}"
        )


def model_config(cfg: DictConfig, vocab_size: int | None) -> GPTConfig:
    """GPTConfig from cfg.model, with vocab_size from the tokenizer when the config leaves it null."""
    fields = cast(dict, OmegaConf.to_container(cfg.model, resolve=True))
    check_known_keys("model", fields)
    for key in match.KEYS:  # matching is resolved before the model is built (matched); the GPT never sees it
        fields.pop(key, None)
    fields["vocab_size"] = fields.get("vocab_size") or vocab_size or 50257
    return GPTConfig(**fields)


def build_model(
    cfg: DictConfig, vocab_size: int | None = None, device=None, activation_checkpointing: bool = False
) -> GPT:
    """The GPT the config describes, on `device` (use "meta" to size even gpt2-xl for free).

    `activation_checkpointing` (hardware.activation_checkpointing) recomputes each block in backward when training.
    """
    import torch

    cfg, _ = matched(cfg, vocab_size)
    mcfg = model_config(cfg, vocab_size)
    norm_factory = _factory(cfg, "norm", drop=("placement",))  # norm.placement is the blocks' (GPT checks it)
    attention, mlp, position = (_factory(cfg, g) for g in ("attention", "mlp", "position"))
    with torch.device(device or "cpu"):
        return GPT(
            mcfg,
            attention=attention,
            mlp=mlp,
            norm=norm_factory,
            position=position,
            norm_placement=cfg.norm.get("placement", "pre"),
            activation_checkpointing=activation_checkpointing,
        )


def matched(cfg: DictConfig, vocab_size: int | None = None) -> tuple[DictConfig, dict | None]:
    """model.match (gptlab/config/match.py): the config the model is built from, with its size knob re-solved to
    the baseline's params or FLOPs/token, and the record of it (None, and `cfg` itself, without model.match)."""
    from gptlab.model.fingerprint import model_fingerprint

    def measure(sizing: DictConfig) -> match.Costs:
        model = build_cost_model(sizing, vocab_size)
        flops = train_flops_per_token(model, int(sizing.model.block_size))
        hidden = cast(Any, model.blocks[0]).mlp.hidden if len(model.blocks) else None
        return match.Costs(model.num_params(non_embedding=True), flops, model_fingerprint(model), hidden)

    return match.resolve(cfg, measure, lambda overrides: _defaults(tuple(overrides)), key=vocab_size)


@functools.cache
def _defaults(overrides: tuple[str, ...]) -> DictConfig:
    """conf/train.yaml composed with `overrides` alone (inside a running Hydra app too): the matching baseline."""
    from hydra.core.global_hydra import GlobalHydra

    try:
        if GlobalHydra.instance().is_initialized():
            return hydra_compose(config_name="train", overrides=list(overrides))
        return compose(list(overrides))
    except Exception as err:  # noqa: BLE001 - Hydra's own errors (unknown choice, bad override) as one line
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"model.match_to={list(overrides)}: {first}") from None


def plain_config(cfg: DictConfig) -> dict:
    """The resolved config as plain Python, without Hydra's own node (what checkpoints and W&B record)."""
    return {
        k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
        for k, v in cfg.items()
        if k != "hydra"
    }


def logger_factories(cfg: DictConfig) -> list[tuple[str, functools.partial]]:
    """(name, sink partial) for each selected logger, cfg.logger.<name>; run.py adds the run-time arguments."""
    made = []
    for name in cfg.get("logger") or {}:
        factory = instantiate(OmegaConf.to_container(cfg.logger[name], resolve=True))
        _check_keys(f"logger.{name}", factory)
        for module, extra in getattr(factory.func, "REQUIRES", ()):  # an optional package the sink writes with
            require(module, extra, f"logger={name}")
        made.append((str(name), factory))
    return made


def build_probes(cfg: DictConfig, data, model) -> list:
    """The selected capability probes (cfg.probes.<name>, gptlab.train.probes), their fixed sets drawn from data_seed."""
    made = []
    for name in cfg.get("probes") or {}:
        factory = instantiate(OmegaConf.to_container(cfg.probes[name], resolve=True))
        _check_keys(f"probes.{name}", factory)
        made.append(factory(seed=int(cfg.data_seed), data=data, model=model))
    return made


def build_hardware(cfg: DictConfig) -> Hardware:
    """The resolved hardware profile."""
    node = cast(dict, OmegaConf.to_container(cfg.hardware, resolve=True))
    check_known_keys("hardware", node)
    node.pop("_target_", None)
    return Hardware(**node)


def build_data(cfg: DictConfig, block_size: int):
    """The data object (see gptlab.data) for this run's data choice and data_seed, cached in GPTLAB_CACHE (never
    inside a run dir: gptlab/state/layout.py check_cache)."""
    cache_dir = check_cache(default_cache_dir())
    return _factory(cfg, "data")(seed=int(cfg.data_seed), block_size=block_size, cache_dir=cache_dir)


def build_optimizer(cfg: DictConfig, model):
    """The optimizer choice over the model's parameters."""
    return _factory(cfg, "optimizer")(model)


def build_schedule(cfg: DictConfig, max_steps: int):
    """The LR multiplier schedule, a pure function of the step."""
    return _factory(cfg, "schedule")(max_steps=max_steps)


def build_cost_model(cfg: DictConfig, vocab_size: int | None = None) -> GPT:
    """A meta-device GPT with one block per distinct layer kind (its `layer_counts`): any n_layer costs seconds."""
    import torch

    from gptlab.model.base import layer_kinds

    cfg, _ = matched(cfg, vocab_size)
    mcfg = model_config(cfg, vocab_size)
    norm = _factory(cfg, "norm", drop=("placement",))
    attention, mlp, position = (_factory(cfg, g) for g in ("attention", "mlp", "position"))
    with torch.device("meta"):
        return GPT(
            mcfg,
            attention=attention,
            mlp=mlp,
            norm=norm,
            position=position,
            norm_placement=str(cfg.norm.get("placement", "pre")),
            layer_counts=layer_kinds(attention, mcfg.n_layer),
        )


def cost_report(
    cfg: DictConfig,
    batch_size: int,
    seq_len: int,
    *,
    vocab_size: int | None = None,
    mode: str = "train",
    dtype: str = "bf16",
    peak_flops: float | None = None,
    mem_bandwidth: float | None = None,
):
    """gptlab-flops' CostReport for this config, from the meta device (the pre-allocation memory check uses it too)."""
    from gptlab.costs.memory import optimizer_state_bytes_per_param
    from gptlab.costs.report import analyze

    model = build_cost_model(cfg, vocab_size)
    state = optimizer_state_bytes_per_param(model, build_optimizer(cfg, model))
    return analyze(
        model,
        batch_size,
        seq_len,
        mode=mode,
        dtype_bytes=dtype,
        peak_flops=peak_flops,
        mem_bandwidth=mem_bandwidth,
        optimizer_state_bytes_per_param=state,
        activation_checkpointing=bool(cfg.hardware.get("activation_checkpointing", False)),
    )


def rank_memory(
    cfg: DictConfig,
    sharding,
    *,
    batch_size: int,
    grad_accum: int,
    seq_len: int,
    vocab_size: int | None = None,
    dtype: str = "bf16",
) -> dict:
    """What one rank holds under `sharding` (a costs.sharding.Sharding): the memory gptlab-flops prints for it."""
    from gptlab.costs.memory import optimizer_state_bytes_per_param
    from gptlab.costs.report import element_bytes
    from gptlab.costs.sharding import per_rank

    model = build_cost_model(cfg, vocab_size)
    state = optimizer_state_bytes_per_param(model, build_optimizer(cfg, model))
    return per_rank(
        model,
        sharding,
        batch_size=batch_size,
        grad_accum=grad_accum,
        seq_len=seq_len,
        compute_bytes=element_bytes(dtype),
        state_bytes_per_param=state,
        activation_checkpointing=bool(cfg.hardware.get("activation_checkpointing", False)),
    )["memory"]
