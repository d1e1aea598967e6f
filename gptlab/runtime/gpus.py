"""Datasheet peaks of NVIDIA GPUs by exact device name, and the peak an MFU figure is measured against.

Figures are the vendors' dense (no 2:4 sparsity) tensor-core peaks in FLOP/s per GPU: bf16/fp16 with fp32
accumulation (what torch's matmuls use), TF32, and plain FP32 (CUDA cores). Names are matched whole
(`re.fullmatch` on torch.cuda.get_device_name()), never by substring: "H100" alone would give the PCIe and
NVL parts the SXM peak, and "A10" would match "A100" and "A10G". A GPU no pattern matches is never given another
part's figure: its MFU is measured against its own matmul peak, measured on the device and cached
(gptlab.runtime.peak.cached_gpu_peak; the run says so in one warning).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gptlab.errors import ConfigError


@dataclass(frozen=True)
class GPUPeaks:
    """Dense peaks of one GPU model; bf16/tf32 are None where the architecture has no such tensor cores."""

    fp16: float
    bf16: float | None
    tf32: float | None
    fp32: float


# (full-name pattern, peaks); datasheet figures, sparse numbers halved where the sheet quotes only those.
_HOPPER_SXM = GPUPeaks(fp16=989.4e12, bf16=989.4e12, tf32=494.7e12, fp32=66.9e12)
_HOPPER_NVL = GPUPeaks(fp16=835.5e12, bf16=835.5e12, tf32=417.5e12, fp32=60e12)
_A100 = GPUPeaks(fp16=312e12, bf16=312e12, tf32=156e12, fp32=19.5e12)
GPU_TABLE: list[tuple[str, GPUPeaks]] = [
    (r"NVIDIA B200", GPUPeaks(fp16=2.25e15, bf16=2.25e15, tf32=1.125e15, fp32=75e12)),
    (r"NVIDIA H200", _HOPPER_SXM),
    (r"NVIDIA H200 NVL", _HOPPER_NVL),
    (r"NVIDIA GH200.*", _HOPPER_SXM),
    (r"NVIDIA H100 80GB HBM3", _HOPPER_SXM),
    (r"NVIDIA H100 NVL", _HOPPER_NVL),
    (r"NVIDIA H100 PCIe", GPUPeaks(fp16=756.5e12, bf16=756.5e12, tf32=378e12, fp32=51.2e12)),
    (r"NVIDIA A100-SXM4-(40|80)GB", _A100),
    (r"NVIDIA A100-PCIE-(40|80)GB|NVIDIA A100 (40|80)GB PCIe", _A100),
    (r"NVIDIA L40S", GPUPeaks(fp16=362.05e12, bf16=362.05e12, tf32=183e12, fp32=91.6e12)),
    (r"NVIDIA L40", GPUPeaks(fp16=181.05e12, bf16=181.05e12, tf32=90.5e12, fp32=90.5e12)),
    (r"NVIDIA L4", GPUPeaks(fp16=121e12, bf16=121e12, tf32=60e12, fp32=30.3e12)),
    (r"NVIDIA A10", GPUPeaks(fp16=125e12, bf16=125e12, tf32=62.5e12, fp32=31.2e12)),
    (r"NVIDIA GeForce RTX 4090", GPUPeaks(fp16=165.2e12, bf16=165.2e12, tf32=82.6e12, fp32=82.6e12)),
    (r"NVIDIA GeForce RTX 3090", GPUPeaks(fp16=71e12, bf16=71e12, tf32=35.6e12, fp32=35.6e12)),
    (r"Tesla V100-SXM[23]-(16|32)GB", GPUPeaks(fp16=125e12, bf16=None, tf32=None, fp32=15.7e12)),
    (r"Tesla V100-PCIE-(16|32)GB", GPUPeaks(fp16=112e12, bf16=None, tf32=None, fp32=14e12)),
    (r"Tesla V100S-PCIE-32GB", GPUPeaks(fp16=130e12, bf16=None, tf32=None, fp32=16.4e12)),
    (r"Tesla T4", GPUPeaks(fp16=65e12, bf16=None, tf32=None, fp32=8.1e12)),
]


def gpu_peaks(name: str) -> GPUPeaks | None:
    """The datasheet peaks of the GPU whose torch device name is exactly `name`, else None."""
    name = " ".join(name.split())
    return next((peaks for pattern, peaks in GPU_TABLE if re.fullmatch(pattern, name)), None)


PEAK_DTYPES = ("fp32", "bf16", "fp16")  # the dtypes the table has figures for


def check_peak_dtype(dtype: str) -> None:
    """One-line ConfigError for a dtype no peak is known or measured for (fp8): never another dtype's figure."""
    if dtype not in PEAK_DTYPES:
        raise ConfigError(
            f"dtype={dtype}: no {dtype} peak FLOP/s in the GPU table or measured here; "
            f"allowed: {', '.join(PEAK_DTYPES)}, or give hardware.peak_flops=<FLOP/s>"
        )


def peak_for(peaks: GPUPeaks, dtype: str, tf32: bool) -> float | None:
    """The matmul peak for autocast `dtype` (fp32 | bf16 | fp16): TF32's when fp32 runs on TF32 tensor cores.

    None when the GPU has no bf16 tensor cores (pre-sm80): the caller refuses bf16 there. Any other dtype (fp8) is
    refused in one line: it never gets another dtype's peak.
    """
    check_peak_dtype(dtype)
    if dtype == "bf16":
        return peaks.bf16
    if dtype == "fp16":
        return peaks.fp16
    return peaks.tf32 if tf32 and peaks.tf32 is not None else peaks.fp32


@dataclass(frozen=True)
class GPUSpec:
    """Datasheet memory and links of one GPU model (bytes, bytes/s); link_bandwidth None where no ring figure fits.

    memory_bytes is the datasheet capacity in 10⁹ bytes, a little below what torch sees (an "80GB" H100 shows about
    79 GiB = 85·10⁹ bytes), so a verdict from it errs towards "does not fit". link_bandwidth is per GPU and per
    direction (a ring sends and receives at once): NVLink for SXM parts, the PCIe slot for PCIe cards.
    """

    memory_bytes: float
    mem_bandwidth: float
    link_bandwidth: float | None
    link: str


_NVLINK4 = (450e9, "NVLink 4 (900 GB/s both ways)")
_NVLINK3 = (300e9, "NVLink 3 (600 GB/s both ways)")
_NVLINK2 = (150e9, "NVLink 2 (300 GB/s both ways)")
_PCIE5, _PCIE4, _PCIE3 = (64e9, "PCIe 5.0 x16"), (32e9, "PCIe 4.0 x16"), (16e9, "PCIe 3.0 x16")
_BRIDGE = (None, "NVLink bridge (2-4 cards): give link_bandwidth")
# Exact torch device names; GH200 (96 or 144 GB under one name) is left out: give gpu_memory.
GPU_SPECS: dict[str, GPUSpec] = {
    "NVIDIA B200": GPUSpec(180e9, 8.0e12, 900e9, "NVLink 5 (1.8 TB/s both ways)"),
    "NVIDIA H200": GPUSpec(141e9, 4.8e12, *_NVLINK4),
    "NVIDIA H200 NVL": GPUSpec(141e9, 4.8e12, *_BRIDGE),
    "NVIDIA H100 80GB HBM3": GPUSpec(80e9, 3.35e12, *_NVLINK4),
    "NVIDIA H100 NVL": GPUSpec(94e9, 3.9e12, *_BRIDGE),
    "NVIDIA H100 PCIe": GPUSpec(80e9, 2.0e12, *_PCIE5),
    "NVIDIA A100-SXM4-40GB": GPUSpec(40e9, 1.555e12, *_NVLINK3),
    "NVIDIA A100-SXM4-80GB": GPUSpec(80e9, 2.039e12, *_NVLINK3),
    "NVIDIA A100-PCIE-40GB": GPUSpec(40e9, 1.555e12, *_PCIE4),
    "NVIDIA A100 80GB PCIe": GPUSpec(80e9, 1.935e12, *_PCIE4),
    "NVIDIA L40S": GPUSpec(48e9, 864e9, *_PCIE4),
    "NVIDIA L40": GPUSpec(48e9, 864e9, *_PCIE4),
    "NVIDIA L4": GPUSpec(24e9, 300e9, *_PCIE4),
    "NVIDIA A10": GPUSpec(24e9, 600e9, *_PCIE4),
    "NVIDIA GeForce RTX 4090": GPUSpec(24e9, 1.008e12, *_PCIE4),
    "NVIDIA GeForce RTX 3090": GPUSpec(24e9, 936e9, *_PCIE4),
    "Tesla V100-SXM2-16GB": GPUSpec(16e9, 900e9, *_NVLINK2),
    "Tesla V100-SXM2-32GB": GPUSpec(32e9, 900e9, *_NVLINK2),
    "Tesla V100-PCIE-16GB": GPUSpec(16e9, 900e9, *_PCIE3),
    "Tesla V100-PCIE-32GB": GPUSpec(32e9, 900e9, *_PCIE3),
    "Tesla V100S-PCIE-32GB": GPUSpec(32e9, 1.134e12, *_PCIE3),
    "Tesla T4": GPUSpec(16e9, 320e9, *_PCIE3),
}


def gpu_spec(name: str) -> GPUSpec | None:
    """The datasheet memory and links of the GPU whose torch device name is exactly `name`, else None."""
    return GPU_SPECS.get(" ".join(name.split()))
