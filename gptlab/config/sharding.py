"""gptlab-flops' sharding keys and the memory a rank is compared with (conf/flops.yaml; docs/COSTS.md, "Sharding").

strategy / world_size / reshard_after_forward / reduce_dtype: the flops key, else hardware.<key> where the profile
has one; a distributed profile without a strategy is ddp over nodes x tasks_per_node ranks. gpu / gpu_memory /
link_bandwidth: the device a rank's total is compared with, else this machine's GPU, else this host's memory.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from gptlab.errors import ConfigError

REDUCE_DTYPES = ("fp32", "bf16", "fp16")


def _pick(cfg: DictConfig, key: str, default):
    """The flops key if set, else hardware.<key> where the hardware profile has it, else `default`."""
    value = OmegaConf.select(cfg, key)
    if value is None:
        value = OmegaConf.select(cfg, f"hardware.{key}", default=None)
    return default if value is None else value


def _positive(key: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
        raise ConfigError(f"{key}={value!r}: expected a positive number or null")


def sharding_option(cfg: DictConfig, mode: str):
    """The Sharding the keys ask for, or None (one device, or a mode other than train on a distributed profile)."""
    from gptlab.costs.report import element_bytes
    from gptlab.costs.sharding import Sharding

    distributed = bool(cfg.hardware.get("distributed", False))
    strategy, world = _pick(cfg, "strategy", "ddp" if distributed else None), _pick(cfg, "world_size", None)
    if strategy is None:
        if world is not None:
            raise ConfigError(f"world_size={world}: needs a strategy; allowed: strategy=ddp|fsdp")
        return None
    if mode != "train":
        if OmegaConf.select(cfg, "strategy") is not None:
            raise ConfigError(f"strategy={strategy}: per-rank memory is a training cost; allowed with mode=train only")
        return None
    if world is None:
        nodes = OmegaConf.select(cfg, "hardware.nodes", default=1) or 1
        world = nodes * (cfg.hardware.get("tasks_per_node", 1) or 1) if distributed else 1
    reshard = _pick(cfg, "reshard_after_forward", True)
    if not isinstance(reshard, bool):
        raise ConfigError(f"reshard_after_forward={reshard!r}: expected true or false")
    reduce = str(_pick(cfg, "reduce_dtype", "fp32"))
    if reduce not in REDUCE_DTYPES:
        raise ConfigError(f"reduce_dtype={reduce}: not allowed; allowed: {', '.join(REDUCE_DTYPES)}")
    offload = OmegaConf.select(cfg, "hardware.cpu_offload", default=False)
    if not isinstance(offload, bool):
        raise ConfigError(f"hardware.cpu_offload={offload!r}: expected true or false")
    return Sharding(str(strategy), world, reshard, element_bytes(reduce), offload)


def _known_gpu(name: str):
    from gptlab.runtime.gpus import GPU_SPECS, gpu_spec

    spec = gpu_spec(name)
    if spec is None:
        raise ConfigError(f"gpu={name}: not in the GPU table; allowed: {', '.join(GPU_SPECS)} (or gpu_memory=BYTES)")
    return spec


def datasheet_roofs(cfg: DictConfig, dtype: str, need_peak: bool = True) -> tuple[float | None, float] | None:
    """(peak FLOP/s, memory bandwidth) of gpu=NAME from the datasheet tables (None without gpu=): that GPU's roofs.

    The peak is None when not `need_peak` (hardware.peak_flops given): a dtype the table lacks (fp8) is refused only
    where its peak would be used."""
    from gptlab.runtime.gpus import gpu_peaks, peak_for

    name = OmegaConf.select(cfg, "gpu")
    if name is None:
        return None
    spec, peaks = _known_gpu(str(name)), gpu_peaks(str(name))
    assert peaks is not None  # every name _known_gpu accepts has datasheet peaks
    if not need_peak:
        return None, spec.mem_bandwidth
    peak = peak_for(peaks, dtype, bool(cfg.hardware.get("tf32", True)))
    if peak is None:
        raise ConfigError(f"gpu={name}: has no {dtype} tensor cores; allowed: hardware.dtype=fp16 or fp32 (or dtype=)")
    return peak, spec.mem_bandwidth


def _this_machine(device: str) -> dict | None:
    """This machine's GPU (datasheet figures when the table knows it) or its host memory, shared by the ranks."""
    import torch

    from gptlab.costs.memory import available_memory
    from gptlab.runtime.gpus import gpu_spec

    kind = torch.device(device).type
    if kind == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name(torch.device(device))
        spec = gpu_spec(name)
        if spec is None:
            total = torch.cuda.get_device_properties(torch.device(device)).total_memory
            return {
                "name": name,
                "memory_bytes": float(total),
                "source": "torch.cuda total_memory",
                "shared_by_ranks": False,
                "link": None,
                "link_bandwidth": None,
            }
        return _datasheet(name, spec)
    found = available_memory(device) if kind == "cpu" else None
    if found is None:
        return None
    return {
        "name": "this host (every rank on it)",
        "memory_bytes": float(found[0]),
        "source": found[1],
        "shared_by_ranks": True,
        "link": None,
        "link_bandwidth": None,
    }


def _datasheet(name: str, spec) -> dict:
    """One GPU's memory and link as its datasheet gives them (a gptlab.runtime.gpus spec)."""
    return {
        "name": name,
        "memory_bytes": spec.memory_bytes,
        "source": "datasheet",
        "shared_by_ranks": False,
        "link": spec.link,
        "link_bandwidth": spec.link_bandwidth,
    }


def check_device_keys(cfg: DictConfig) -> None:
    """gpu (a known GPU), gpu_memory and link_bandwidth (> 0), checked on every gptlab-flops call, whether or not the
    report then needs them: a bad value is one line, never silently unused."""
    name, memory, link = (OmegaConf.select(cfg, k) for k in ("gpu", "gpu_memory", "link_bandwidth"))
    _positive("gpu_memory", memory)
    _positive("link_bandwidth", link)
    if name is not None:
        _known_gpu(str(name))


def device_memory(cfg: DictConfig, device: str) -> dict | None:
    """What one rank is compared with: gpu=NAME (datasheet), gpu_memory=BYTES, else this machine; link_bandwidth."""
    name, memory, link = (OmegaConf.select(cfg, k) for k in ("gpu", "gpu_memory", "link_bandwidth"))
    check_device_keys(cfg)
    out = _datasheet(str(name), _known_gpu(str(name))) if name is not None else _this_machine(device)
    if memory is not None:
        out = {
            **(out or {"name": "given", "link": None, "link_bandwidth": None}),
            "memory_bytes": float(memory),
            "source": "gpu_memory",
            "shared_by_ranks": False,
        }
    if link is not None:
        out = {
            **(out or {"name": "unknown", "memory_bytes": None, "source": None, "shared_by_ranks": False}),
            "link": "link_bandwidth",
            "link_bandwidth": float(link),
        }
    return out


def grad_accum(cfg: DictConfig) -> int:
    """train.grad_accum: the micro-steps training splits batch_size into (its memory is one micro-batch's)."""
    accum = OmegaConf.select(cfg, "train.grad_accum", default=1)
    if isinstance(accum, bool) or not isinstance(accum, int) or accum < 1:
        raise ConfigError(f"train.grad_accum={accum!r}: expected a positive integer")
    return accum


def section(cfg: DictConfig, model, report, sharding, state_bytes_per_param: float, device: str) -> dict:
    """The report's `sharding` entry: per-rank memory, its verdict and the communication per optimizer step."""
    from gptlab.costs.sharding import per_rank

    return per_rank(
        model,
        sharding,
        batch_size=report.batch_size,
        grad_accum=grad_accum(cfg),
        seq_len=report.seq_len,
        compute_bytes=report.dtype_bytes,
        state_bytes_per_param=state_bytes_per_param,
        activation_checkpointing=bool(cfg.hardware.get("activation_checkpointing", False)),
        device=device_memory(cfg, device),
    )
