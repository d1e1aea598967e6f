"""Hardware profiles: where a run executes, in what precision, and the peak FLOP/s its MFU is measured against.

Compilation (hardware.compile) is applied in place with `nn.Module.compile`, so parameter names and checkpoints are
those of the eager model. CUDA graphs (compile modes reduce-overhead and max-autotune) are refused in one line where
they cannot work: without a CUDA device (reduce-overhead; max-autotune on CPU keeps its CPU autotuning) and in a
distributed run (DDP's and FSDP's gradient hooks, run outside the captured graphs). Generation, whose shapes change
every token, runs eager either way (gptlab.model.gpt.GPT.generate).

MFU's denominator (peak FLOP/s): hardware.peak_flops when given; on CUDA the datasheet figure of the GPU model
(gptlab.runtime.gpus), or for a model the table lacks its dense matmul peak measured on the device (cached per device
name and dtype, gptlab.runtime.peak), said in one warning; on CPU a cached measurement.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from dataclasses import dataclass, field

import torch

from gptlab.errors import ConfigError
from gptlab.util.checks import Auto, Number, OneOf, rule

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# hardware.compile: false = eager; true = torch.compile's "default" mode; or a torch.compile mode by name
COMPILE_MODES = (False, True, "default", "reduce-overhead", "max-autotune")
# the modes that capture CUDA graphs (torch._inductor.list_mode_options: triton.cudagraphs)
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
# hardware.strategy: how gptlab.runtime.distributed.wrap spreads a distributed run over its ranks
STRATEGIES = ("ddp", "fsdp")


def compile_mode(value) -> str | None:
    """hardware.compile as torch.compile's `mode` (None = do not compile); anything else is a one-line ConfigError."""
    if value is False:
        return None
    if value is True:
        return "default"
    if isinstance(value, str) and value in COMPILE_MODES:
        return value
    raise ConfigError(
        f"hardware.compile: {value!r} is not allowed; allowed: false, true, default, reduce-overhead, max-autotune"
    )


@dataclass
class Hardware:
    """A resolved profile: device, autocast dtype, compile/checkpointing switches, peaks, threads, and for
    distributed runs the strategy (ddp | fsdp, see gptlab.runtime.distributed.wrap)."""

    # the schema of the hardware.* keys too: annotation = type, rule = range (gptlab/config/schema.py); device and dtype
    # are resolved and checked in __post_init__; curve=False: a resume may change the key (it never changes the curve)
    device: str = "cpu"
    dtype: str = "bf16"
    compile: bool | str = field(default=False, metadata=rule(check=OneOf(COMPILE_MODES)))  # compile_mode() maps it
    activation_checkpointing: bool = False
    peak_flops: float | str = field(default="auto", metadata=rule(check=Auto(Number("> 0"))))
    mem_bandwidth: float | str = field(default="auto", metadata=rule(check=Auto(Number("> 0"))))
    threads: int | None = field(default=None, metadata=rule(">= 1", curve=False))
    tf32: bool = True
    distributed: bool = False
    # ddp replicates the model, fsdp shards it (FSDP2, DCP checkpoints)
    strategy: str = field(default="ddp", metadata=rule(check=OneOf(STRATEGIES)))
    cpu_offload: bool = False  # fsdp: sharded params, grads and optimizer state in CPU memory (CPUOffloadPolicy)
    # fsdp: free each block's gathered params after forward, gather in backward (when, never what they hold)
    reshard_after_forward: bool = field(default=True, metadata=rule(curve=False))
    name: str = "cpu"
    # resources a launcher (launcher=local|slurm) requests per run; the world size they make is checked on resume
    cpus_per_task: int | None = field(default=None, metadata=rule(">= 1", curve=False))
    nodes: int = field(default=1, metadata=rule(">= 1", curve=False))  # SLURM nodes; torchrun takes its own --nnodes
    tasks_per_node: int = field(default=1, metadata=rule(">= 1", curve=False))
    gpus_per_node: int | None = field(default=None, metadata=rule(">= 0", curve=False))

    def __post_init__(self):
        compile_mode(self.compile)
        if self.dtype not in (*DTYPES, "auto"):
            raise ConfigError(f"hardware.dtype: unknown dtype '{self.dtype}'; allowed: auto, {', '.join(DTYPES)}")
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device.startswith("cuda"):
            self.device = cuda_device(self.device, self.distributed, self.strategy)
        elif self.device not in ("cpu", "meta"):
            raise ConfigError(f"hardware.device: unknown device '{self.device}'; allowed: cpu, cuda, cuda:N, auto")
        if self.dtype == "auto":
            self.dtype = native_low_precision(self.device)
        self._check_strategy()
        self._check_cuda_graphs()

    def _check_cuda_graphs(self) -> None:
        """Refuse (one line) a CUDA-graph compile mode where the graphs cannot work: no CUDA device, or distributed."""
        mode = compile_mode(self.compile)
        if mode not in CUDA_GRAPH_MODES:
            return
        if mode == "reduce-overhead" and not self.device.startswith("cuda"):
            raise ConfigError(
                f"hardware.compile=reduce-overhead: CUDA graphs need a CUDA device (device={self.device}); "
                "allowed here: false, true, default, max-autotune"
            )
        if self.distributed and self.device.startswith("cuda"):
            raise ConfigError(
                f"hardware.compile={mode}: CUDA graphs do not work under hardware.distributed=true (the "
                f"{self.strategy} gradient hooks run outside the captured graphs); allowed here: false, true, default"
            )

    def _check_strategy(self) -> None:
        """The strategy keys against each other, the device and the resolved dtype (one-line ConfigError)."""
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"hardware.strategy: {self.strategy!r} is not allowed; allowed: {', '.join(STRATEGIES)}")
        if self.strategy == "fsdp" and not self.distributed:
            raise ConfigError(
                "hardware.strategy=fsdp needs hardware.distributed=true; use hardware=fsdp (GPUs) or "
                "hardware=fsdp_cpu (gloo)"
            )
        if self.nodes != 1 and not self.distributed:
            raise ConfigError(
                f"hardware.nodes={self.nodes} needs a distributed profile (hardware.distributed=true); "
                "use hardware=ddp, ddp_cpu, fsdp or fsdp_cpu"
            )
        if self.cpu_offload and self.strategy != "fsdp":
            raise ConfigError(
                f"hardware.cpu_offload=true needs hardware.strategy=fsdp (here {self.strategy}); use hardware=fsdp"
            )
        if self.cpu_offload and not self.device.startswith("cuda"):
            raise ConfigError(
                f"hardware.cpu_offload=true: device={self.device} already keeps everything in CPU "
                "memory; allowed: false, or true with a CUDA device (hardware=fsdp)"
            )
        if self.strategy == "fsdp" and self.dtype == "fp16":
            raise ConfigError(
                "hardware.dtype=fp16: not supported with hardware.strategy=fsdp (the fp16 GradScaler "
                "would see only this rank's shard of the gradients); allowed: bf16, fp32"
            )

    def compiled(self, model):
        """`model`, compiled in place (`model.compile(mode=...)`: state-dict keys stay unprefixed) in this profile's
        mode, or untouched when compile is false; returns `model`. On CUDA, a missing Triton or a GPU older than
        sm_70 (which Triton cannot compile for) is refused in one line before any compilation starts."""
        mode = compile_mode(self.compile)
        if mode is None:
            return model
        if self.device.startswith("cuda"):
            check_compiles_on_cuda(torch.device(self.device).index, self.compile)
        model.compile(mode=mode)
        return model

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def autocast(self):
        """Autocast context for forward passes (a no-op for fp32)."""
        if self.dtype == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.split(":")[0], dtype=self.torch_dtype)

    def apply(self) -> None:
        """Process-wide settings: thread count; on CUDA the device, a dtype it supports, and TF32 matmuls."""
        if self.threads:
            torch.set_num_threads(int(self.threads))
        if self.device.startswith("cuda"):
            index = torch.device(self.device).index
            torch.cuda.set_device(index)  # needs an explicit index: __post_init__ resolved "cuda" to "cuda:N"
            check_native_dtype(self.dtype, index)
            # torch's fp32_precision API; the older allow_tf32 flags are deprecated and must not be mixed with it
            precision = "tf32" if self.tf32 else "ieee"
            torch.backends.cuda.matmul.fp32_precision = precision
            torch.backends.cudnn.conv.fp32_precision = precision  # type: ignore[attr-defined]  # not in torch's stubs

    def resolved_peak_flops(self, cache_dir) -> float:
        """The peak FLOP/s for MFU: the configured number; on CUDA the GPU's datasheet value, or for a GPU the table
        lacks its measured matmul peak (cached per device name and dtype in cache_dir; one warning line says so);
        on CPU a cached measurement. cache_dir None: a measurement is not cached."""
        if self.peak_flops != "auto":
            return float(self.peak_flops)
        if self.device.startswith("cuda"):
            index = torch.device(self.device).index
            peak = datasheet_peak(index, self.dtype, self.tf32)
            return peak if peak is not None else self._measured_gpu_peak(index, cache_dir)
        from gptlab.runtime.peak import cached_peak

        return cached_peak(self.device, self.torch_dtype, cache_dir)

    def _measured_gpu_peak(self, index: int, cache_dir) -> float:
        """The matmul peak of a GPU without a datasheet entry, measured (or cached) in this run's dtype."""
        from gptlab.runtime.peak import cached_gpu_peak

        check_native_dtype(self.dtype, index)  # bf16 on a pre-sm80 GPU: refused, not measured emulated
        name = torch.cuda.get_device_name(index)
        peak, source = cached_gpu_peak(self.device, self.torch_dtype, self.tf32, cache_dir)
        what = self.dtype + (" (TF32)" if self.dtype == "fp32" and self.tf32 else "")
        log.warning(
            "no datasheet peak for '%s': MFU uses its measured dense %s matmul peak, %.1f TFLOP/s (%s); "
            "set hardware.peak_flops=<FLOP/s> for a datasheet figure",
            name,
            what,
            peak / 1e12,
            source,
        )
        return peak


def cpu_has_bf16() -> bool:
    """True where the CPU multiplies bf16 natively (AVX512-BF16 or AMX); elsewhere torch emulates it ~10x slower."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line.split(":", 1)[1].split() for line in fh if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def native_low_precision(device: str) -> str:
    """dtype=auto: bf16 where the hardware runs it natively (GPUs from sm_80, AMX/AVX512-BF16 CPUs), else fp16 on
    older GPUs and fp32 on other CPUs (emulated bf16 there is ~10x slower than fp32, measured on an AVX2 EPYC)."""
    if device.startswith("cuda"):
        return "bf16" if torch.cuda.get_device_capability(torch.device(device).index)[0] >= 8 else "fp16"
    return "bf16" if device == "meta" or cpu_has_bf16() else "fp32"


def dtype_reason(device: str, dtype: str, configured: str) -> str:
    """Why a run computes in `dtype`: the user's hardware.dtype, or what dtype=auto found on `device`."""
    if configured != "auto":
        return "hardware.dtype"
    if device.startswith("cuda"):
        return f"auto: {'bf16 is native' if dtype == 'bf16' else 'no native bf16'} on this GPU"
    if dtype == "bf16":
        return "auto: this CPU multiplies bf16 natively (avx512_bf16/amx)"
    return "auto: this CPU has no native bf16 (emulated bf16 is ~10x slower than fp32)"


def cuda_device(device: str, distributed: bool, strategy: str = "ddp") -> str:
    """ "cuda" or "cuda:N" as an explicit "cuda:N" that exists here: LOCAL_RANK's GPU under DDP, else the current one."""
    if not torch.cuda.is_available():
        instead = f"hardware={strategy}_cpu" if distributed and strategy in STRATEGIES else "hardware=cpu"
        raise ConfigError(f"hardware.device={device}: no CUDA device is available here; use {instead}")
    try:
        index = torch.device(device).index
    except RuntimeError:
        raise ConfigError(f"hardware.device: unknown device '{device}'; allowed: cpu, cuda, cuda:N, auto") from None
    if index is None and distributed:
        # torchrun sets LOCAL_RANK; a SLURM task learns it only later from submitit, so SLURM_LOCALID here
        index = int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")))
    elif index is None:
        index = torch.cuda.current_device() if torch.cuda.is_initialized() else 0  # "cuda" = the current device
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise ConfigError(
            f"hardware.device=cuda:{index}: only {count} CUDA device(s) are visible here "
            f"(allowed: cuda:0..cuda:{count - 1}); launch at most {count} ranks per node"
        )
    return f"cuda:{index}"


def check_native_dtype(dtype: str, index: int) -> None:
    """Refuse bf16 on GPUs without bf16 tensor cores (before sm_80), where torch would emulate it slowly."""
    major, minor = torch.cuda.get_device_capability(index)
    if dtype == "bf16" and major < 8:
        name = torch.cuda.get_device_name(index)
        raise ConfigError(
            f"hardware.dtype=bf16: {name} (sm_{major}{minor}) has no native bf16; use hardware.dtype=fp16 (or fp32)"
        )


def check_compiles_on_cuda(index: int, value) -> None:
    """torch.compile on CUDA generates Triton kernels: refuse (one line) when Triton is missing or GPU `index` is
    older than sm_70, instead of failing inside the first step with Inductor's traceback."""
    if importlib.util.find_spec("triton") is None:
        raise ConfigError(
            f"hardware.compile={str(value).lower()}: torch.compile on CUDA needs Triton, which is not installed; "
            "install it (pip install triton) or set hardware.compile=false"
        )
    major, minor = torch.cuda.get_device_capability(index)
    if major < 7:
        raise ConfigError(
            f"hardware.compile={str(value).lower()}: {torch.cuda.get_device_name(index)} (sm_{major}{minor}) is older "
            "than Triton supports (sm_70); set hardware.compile=false"
        )


def datasheet_peak(index: int, dtype: str, tf32: bool) -> float | None:
    """The datasheet matmul peak of GPU `index` for this dtype (TF32's for fp32 with TF32 on); None for a GPU model
    the table lacks (the caller measures it)."""
    from gptlab.runtime.gpus import gpu_peaks, peak_for

    name = torch.cuda.get_device_name(index)
    peaks = gpu_peaks(name)
    if peaks is None:
        return None
    peak = peak_for(peaks, dtype, tf32)
    if peak is None:
        check_native_dtype(dtype, index)  # raises the one-line bf16 refusal
        raise ConfigError(f"hardware.dtype={dtype}: {name} has no {dtype} tensor cores; use hardware.dtype=fp16")
    return peak
