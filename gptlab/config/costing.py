"""A composed gptlab-flops config (conf/flops.yaml over gptlab-train's groups) -> the CostReport it asks for: its
own keys checked (mode, format, batch_size, seq_len, dtype=, the accounting switches), the roofs resolved (given,
a gpu=NAME datasheet, or measured once and cached for 'auto'), the model built on the meta device one block per
distinct layer kind; and a run dir costed as it trained (its saved config, its tokenizer's vocabulary, its sequence
length). Raises ConfigError, one line, for bad input; prints nothing (gptlab-flops does).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gptlab.config.sharding import check_device_keys, datasheet_roofs, grad_accum, section, sharding_option
from gptlab.errors import ConfigError
from gptlab.util.paths import CONF_DIR

DEFAULT_VOCAB = 50257  # GPT-2 BPE, the tokenizer default when model.vocab_size is null
FORMATS = ("table", "json")
DTYPES = ("fp32", "bf16", "fp16", "fp8")  # the dtype= shorthand (null or auto: hardware.dtype)


def _int_key(cfg: DictConfig, key: str, fallback_key: str) -> int:
    value = OmegaConf.select(cfg, key)
    if value is None:
        value = OmegaConf.select(cfg, fallback_key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key}={value!r}: expected a positive integer (null = {fallback_key})")
    return value


def _roofs(cfg: DictConfig) -> tuple[float, float, str]:
    """(peak FLOP/s, bandwidth bytes/s, dtype) of the hardware profile; 'auto' is measured once and cached."""
    import torch

    from gptlab.config.build import build_hardware
    from gptlab.data import default_cache_dir
    from gptlab.runtime.gpus import check_peak_dtype

    hw = cfg.hardware
    device = _device(cfg)
    # gpu=NAME costs that GPU: dtype auto resolves as on a GPU, its datasheet roofs stand in for 'auto'
    dtype = _dtype(_dtype_key(cfg, str(hw.get("dtype", "bf16"))), "cuda" if OmegaConf.select(cfg, "gpu") else device)
    peak, bw = hw.get("peak_flops", "auto"), hw.get("mem_bandwidth", "auto")
    sheet = datasheet_roofs(cfg, dtype, need_peak=peak == "auto") if "auto" in (peak, bw) else None
    if sheet is not None:
        peak, bw = sheet[0] if peak == "auto" else peak, sheet[1] if bw == "auto" else bw
    if "auto" in (peak, bw) and device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"hardware.device={device}: no such device here to measure 'auto' roofs; set "
            "hardware.peak_flops=<FLOP/s> and hardware.mem_bandwidth=<bytes/s>, or gpu=<GPU name>"
        )
    for key, value in (("peak_flops", peak), ("mem_bandwidth", bw)):
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise ConfigError(f"hardware.{key}={value!r}: expected a positive number or auto")
    if peak == "auto":
        check_peak_dtype(dtype)  # measured in hardware.dtype: never fp8's
        peak = build_hardware(cfg).resolved_peak_flops(default_cache_dir())
    if bw == "auto":
        from gptlab.runtime.peak import cached_bandwidth

        bw = cached_bandwidth(device, default_cache_dir())
    return float(peak), float(bw), dtype


def _device(cfg: DictConfig) -> str:
    """hardware.device, with auto resolved as training resolves it here."""
    import torch

    device = str(cfg.hardware.get("device", "cpu"))
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _dtype_key(cfg: DictConfig, hardware_dtype: str) -> str:
    """The dtype= shorthand if given, else hardware.dtype."""
    value = OmegaConf.select(cfg, "dtype")
    if value is None or value == "auto":
        return hardware_dtype
    if value not in DTYPES:
        raise ConfigError(f"dtype={value}: not allowed; allowed: {', '.join(DTYPES)} (null = hardware.dtype)")
    return value


def _accounting(cfg: DictConfig):
    """The Accounting of the mask_pass / elementwise / blocks_only keys."""
    from gptlab.costs.accounting import DEFAULT_UNFUSED, from_options

    elementwise = OmegaConf.select(cfg, "elementwise", default=list(DEFAULT_UNFUSED))
    if OmegaConf.is_config(elementwise):
        elementwise = OmegaConf.to_container(elementwise)
    return from_options(
        mask_pass=OmegaConf.select(cfg, "mask_pass", default=False),
        elementwise=elementwise,
        blocks_only=OmegaConf.select(cfg, "blocks_only", default=False),
    )


def _dtype(dtype: str, device: str) -> str:
    """hardware.dtype, with auto resolved as training would resolve it here (bf16 for a GPU not present)."""
    if dtype != "auto":
        return dtype
    import torch

    from gptlab.runtime.hardware import native_low_precision

    if device.startswith("cuda") and not torch.cuda.is_available():
        return "bf16"  # costing a GPU profile elsewhere: the datasheet GPUs gptlab targets run bf16
    return native_low_precision(device)


def flops_report(cfg: DictConfig, vocab_size: int = DEFAULT_VOCAB, seq_default: int | None = None):
    """The CostReport the composed flops config asks for (raises ConfigError on bad input); `vocab_size` where
    model.vocab_size is null, `seq_default` for seq_len=null (a run's own sequence length, else model.block_size)."""
    from gptlab.config.build import build_cost_model, build_optimizer
    from gptlab.costs.memory import optimizer_state_bytes_per_param
    from gptlab.costs.report import MODES, analyze

    mode, fmt = str(cfg.mode), str(cfg.format)
    if mode not in MODES:
        raise ConfigError(f"mode={mode}: not allowed; allowed: {', '.join(MODES)}")
    if fmt not in FORMATS:
        raise ConfigError(f"format={fmt}: not allowed; allowed: {', '.join(FORMATS)}")
    check_device_keys(cfg)  # gpu, gpu_memory, link_bandwidth: checked even where only a sharded report reads them
    batch = _int_key(cfg, "batch_size", "train.batch_size")
    seq = (
        seq_default
        if OmegaConf.select(cfg, "seq_len") is None and seq_default
        else _int_key(cfg, "seq_len", "model.block_size")
    )
    if seq > cfg.model.block_size:
        raise ConfigError(f"seq_len={seq}: exceeds model.block_size={cfg.model.block_size}; use seq_len <= block_size")
    accounting = _accounting(cfg)
    sharding = sharding_option(cfg, mode)
    peak, bw, dtype = _roofs(cfg)
    # build.cost_report with the accounting switches: one block per distinct layer kind, times its layers
    # (model.n_layer=100000 costs seconds, not a build of each)
    model = build_cost_model(cfg, vocab_size)
    state = optimizer_state_bytes_per_param(model, build_optimizer(cfg, model))
    report = analyze(
        model,
        batch,
        seq,
        mode=mode,
        dtype_bytes=dtype,
        peak_flops=peak,
        mem_bandwidth=bw,
        optimizer_state_bytes_per_param=state,
        accounting=accounting,
        kv_quant=cfg.get("kv_quant"),
        activation_checkpointing=bool(cfg.hardware.get("activation_checkpointing", False)),
        grad_accum=grad_accum(cfg),  # training memory is one micro-batch's, as training's own check sizes it
    )
    if sharding is not None:
        report.sharding = section(cfg, model, report, sharding, state, _device(cfg))
    masked = OmegaConf.select(cfg, "data.doc_mask") is True and mode == "train"
    if not masked and OmegaConf.select(cfg, "doc_length") is not None:  # an inert key: never a silent no-op
        raise ConfigError(
            f"doc_length={OmegaConf.select(cfg, 'doc_length')}: costs the document mask of a training step; allowed "
            "with data.doc_mask=true and mode=train, else null"
        )
    if masked:
        from gptlab.costs.documents import documents_cost
        from gptlab.costs.structure import describe

        report.documents = documents_cost(describe(model), batch, seq, _doc_length(cfg))
    return report


def _doc_length(cfg: DictConfig) -> int | None:
    """doc_length: the mean tokens per document data.doc_mask is costed at (null: not known)."""
    value = OmegaConf.select(cfg, "doc_length")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"doc_length={value!r}: expected a positive integer (tokens per document) or null")
    return value


def own_keys() -> DictConfig:
    """conf/flops.yaml's own keys (mode, batch_size, seq_len, format, ...) with their defaults."""
    own = OmegaConf.load(CONF_DIR / "flops.yaml")
    assert isinstance(own, DictConfig)
    for key in ("defaults", "hydra"):
        own.pop(key, None)
    return own


def run_dir_config(run_dir: Path, keys: list[str]) -> tuple[DictConfig, int, int | None]:
    """`gptlab-flops RUN_DIR [KEY=VALUE ...]`: (the run's own composed config, as it trained, with conf/flops.yaml's
    keys and `keys` applied; the vocabulary it trained with; its sequence length). Only gptlab-flops' own keys may
    be given: the run is costed as it ran, never re-composed from today's config files."""
    from gptlab.sinks.jsonl import read_summary
    from gptlab.state.rundir import run_config, saved_tokenizer

    saved = run_config(run_dir)
    own = own_keys()
    for item in keys:
        if "=" not in item or item.split("=", 1)[0] not in own:
            raise ConfigError(
                f"{item}: gptlab-flops RUN_DIR costs the run as it trained; allowed: its own keys "
                f"({', '.join(str(k) for k in own)}); to cost a changed config give overrides without RUN_DIR"
            )
    cfg = OmegaConf.merge(saved, own, OmegaConf.from_dotlist(keys))
    assert isinstance(cfg, DictConfig)
    tokenizer = saved_tokenizer(run_dir, None)
    vocab = OmegaConf.select(cfg, "model.vocab_size") or (tokenizer.vocab_size if tokenizer is not None else None)
    if vocab is None:
        raise ConfigError(
            f"{run_dir}: no tokenizer.json (a run from before runs kept their tokenizer), so the vocabulary it trained "
            "with is unknown; give overrides without RUN_DIR and model.vocab_size=<its vocabulary>"
        )
    seq = read_summary(run_dir / "summary.json").get("seq_len")  # the shared reader: a damaged file is one line
    return cfg, int(vocab), seq if isinstance(seq, int) and seq > 0 else None
