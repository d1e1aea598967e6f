"""Hardware profiles: where a run executes, in what precision, and the peak FLOP/s its MFU is measured against."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from gptlab.errors import ConfigError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# Dense bf16/fp16 tensor-core peaks (FLOP/s) from vendor datasheets, by substring of the device name.
GPU_PEAKS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12,
             "4090": 165e12, "3090": 71e12, "V100": 125e12, "T4": 65e12}


@dataclass
class Hardware:
    """A resolved profile: device, autocast dtype, compile/checkpointing switches, peaks, threads."""

    device: str = "cpu"
    dtype: str = "bf16"
    compile: bool = False
    activation_checkpointing: bool = False
    peak_flops: float | str = "auto"
    mem_bandwidth: float | str = "auto"
    threads: int | None = None
    tf32: bool = True
    distributed: bool = False
    name: str = "cpu"
    # resources a launcher (launcher=local|slurm) requests per run
    cpus_per_task: int | None = None
    tasks_per_node: int = 1
    gpus_per_node: int | None = None

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ConfigError(f"hardware.dtype: unknown dtype '{self.dtype}'; allowed: {', '.join(DTYPES)}")
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"hardware.device={self.device}: no CUDA device is available here; use hardware=cpu")
        if self.device not in ("cpu", "meta") and not self.device.startswith("cuda"):
            raise ConfigError(f"hardware.device: unknown device '{self.device}'; allowed: cpu, cuda, cuda:N, auto")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def autocast(self):
        """Autocast context for forward passes (a no-op for fp32)."""
        if self.dtype == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.split(":")[0], dtype=self.torch_dtype)

    def apply(self) -> None:
        """Process-wide settings: thread count, TF32 matmuls, the CUDA device."""
        if self.threads:
            torch.set_num_threads(int(self.threads))
        if self.device.startswith("cuda"):
            torch.backends.cuda.matmul.allow_tf32 = self.tf32
            torch.backends.cudnn.allow_tf32 = self.tf32
            torch.cuda.set_device(torch.device(self.device))

    def resolved_peak_flops(self, cache_dir) -> float:
        """The peak FLOP/s for MFU: the configured number, a datasheet value, or a cached CPU measurement."""
        if self.peak_flops != "auto":
            return float(self.peak_flops)
        if self.device.startswith("cuda"):
            name = torch.cuda.get_device_name()
            for key, peak in GPU_PEAKS.items():
                if key in name:
                    return peak if self.dtype != "fp32" else peak / 16
            raise ConfigError(f"hardware.peak_flops: no datasheet peak known for '{name}'; set hardware.peak_flops=<FLOP/s>")
        from gptlab.costs.peak import cached_peak

        return cached_peak(self.device, self.torch_dtype, cache_dir)


def threads_for_job() -> int:
    """Cores this process may use: SLURM's allocation, else the CPU affinity mask."""
    for var in ("SLURM_CPUS_PER_TASK", "GPTLAB_THREADS"):
        if os.environ.get(var):
            return max(1, int(os.environ[var]))
    return max(1, len(os.sched_getaffinity(0)))
