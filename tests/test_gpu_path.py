"""The CUDA path of hardware setup, the peak table, the DDP profiles and local GPU placement (issue 12).

This machine has no GPU: every test that needs CUDA says so and runs against the mocked torch.cuda of
helpers.gpu_mocks.fake_cuda (device count, names, capabilities and set_device calls are the mock's).
"""

from __future__ import annotations

import logging
import os
import warnings

import pytest
import torch

from gptlab.config import build
from gptlab.config.build import build_hardware, compose
from gptlab.errors import ConfigError
from gptlab.runtime import placement
from gptlab.runtime.gpus import gpu_peaks
from gptlab.runtime.hardware import Hardware
from gptlab.runtime.threads import threads_for_job
from helpers.gpu_mocks import fake_cuda  # noqa: F401  (a fixture)
from helpers.train import run_inprocess

# ---- 1. device resolution -----------------------------------------------------------------------------


def test_cuda_resolves_to_an_indexed_device_and_apply_sets_it(fake_cuda):
    """CUDA mocked: "cuda" and "auto" become "cuda:0", and apply() hands set_device an index (not a bare device)."""
    for device in ("cuda", "auto"):
        hw = Hardware(device=device, dtype="bf16")
        assert hw.device == "cuda:0"
        hw.apply()
    assert fake_cuda.set_device_calls == [0, 0]


def test_ddp_rank_takes_its_local_rank_gpu(fake_cuda, monkeypatch):
    """CUDA mocked (2 GPUs): a distributed rank with LOCAL_RANK=1 trains on cuda:1; a third rank is refused."""
    fake_cuda.count = 2
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert Hardware(device="cuda", distributed=True).device == "cuda:1"
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(ConfigError, match=r"^hardware.device=cuda:2: only 2 CUDA device\(s\) are visible here"):
        Hardware(device="cuda", distributed=True)
    with pytest.raises(ConfigError, match="allowed: cuda:0..cuda:1"):
        Hardware(device="cuda:5")


class _Reached(Exception):
    pass


def test_gptlab_train_hardware_cuda_gets_past_device_setup(fake_cuda, monkeypatch, tmp_path):
    """CUDA mocked: execute() with hardware=cuda sets up the device and reaches data loading (stopped there)."""

    def stop(*args, **kwargs):
        raise _Reached

    monkeypatch.setattr(build, "build_data", stop)
    with pytest.raises(_Reached):
        run_inprocess(tmp_path / "run", "hardware=cuda")
    assert fake_cuda.set_device_calls == [0]
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"


# ---- 3. peak FLOP/s by exact device name ---------------------------------------------------------------

PEAKS = [  # name, bf16 peak, fp32 peak with TF32 on, fp32 peak with TF32 off (vendor datasheets, dense)
    ("NVIDIA H100 80GB HBM3", 989.4e12, 494.7e12, 66.9e12),
    ("NVIDIA H100 PCIe", 756.5e12, 378e12, 51.2e12),
    ("NVIDIA H100 NVL", 835.5e12, 417.5e12, 60e12),
    ("NVIDIA H200", 989.4e12, 494.7e12, 66.9e12),
    ("NVIDIA A100-SXM4-80GB", 312e12, 156e12, 19.5e12),
    ("NVIDIA A100-PCIE-40GB", 312e12, 156e12, 19.5e12),
    ("NVIDIA A100 80GB PCIe", 312e12, 156e12, 19.5e12),
    ("NVIDIA A10", 125e12, 62.5e12, 31.2e12),
    ("NVIDIA L4", 121e12, 60e12, 30.3e12),
    ("NVIDIA L40S", 362.05e12, 183e12, 91.6e12),
    ("NVIDIA B200", 2.25e15, 1.125e15, 75e12),
    ("NVIDIA GeForce RTX 4090", 165.2e12, 82.6e12, 82.6e12),
    ("NVIDIA GeForce RTX 3090", 71e12, 35.6e12, 35.6e12),
]


@pytest.mark.parametrize("name,bf16,tf32,fp32", PEAKS, ids=[p[0] for p in PEAKS])
def test_datasheet_peak_by_exact_name(fake_cuda, name, bf16, tf32, fp32):
    """CUDA mocked: the peak for this device name; fp32 uses the TF32 peak when TF32 is on, plain FP32 when off."""
    fake_cuda.name = name
    peak = {
        (d, t): Hardware(device="cuda", dtype=d, tf32=t).resolved_peak_flops(None)
        for d in ("bf16", "fp32")
        for t in (True, False)
    }
    assert peak == {("bf16", True): bf16, ("bf16", False): bf16, ("fp32", True): tf32, ("fp32", False): fp32}


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA H100", "NVIDIA GeForce RTX 3090 Ti", "NVIDIA H800"])
def test_unknown_or_partial_names_are_not_guessed(fake_cuda, name):
    """No substring matches ("A10" is not "A10G"): a name the datasheet table does not hold gets no other part's
    figure (its peak is measured on the device: tests/test_gpu_ready.py); hardware.peak_flops still overrides."""
    fake_cuda.name = name
    assert gpu_peaks(name) is None
    assert Hardware(device="cuda", peak_flops=1e14).resolved_peak_flops(None) == 1e14


@pytest.mark.parametrize(
    "name,cap,fp16,fp32", [("Tesla V100-SXM2-16GB", (7, 0), 125e12, 15.7e12), ("Tesla T4", (7, 5), 65e12, 8.1e12)]
)
def test_pre_sm80_refuses_bf16_and_has_no_tf32(fake_cuda, name, cap, fp16, fp32):
    """CUDA mocked: V100/T4 have no bf16 tensor cores (refused in one line) and no TF32 (fp32 peak either way)."""
    fake_cuda.name, fake_cuda.capability = name, cap
    message = f"hardware.dtype=bf16: {name} (sm_{cap[0]}{cap[1]}) has no native bf16; use hardware.dtype=fp16 (or fp32)"
    with pytest.raises(ConfigError) as err:
        Hardware(device="cuda", dtype="bf16").apply()
    assert str(err.value) == message
    with pytest.raises(ConfigError) as err:
        Hardware(device="cuda", dtype="bf16").resolved_peak_flops(None)
    assert str(err.value) == message
    Hardware(device="cuda", dtype="fp16").apply()
    assert Hardware(device="cuda", dtype="fp16").resolved_peak_flops(None) == fp16
    assert Hardware(device="cuda", dtype="fp32", tf32=True).resolved_peak_flops(None) == fp32


# ---- 4. TF32 through fp32_precision, never allow_tf32 --------------------------------------------------


class _Recorder:
    """Records every attribute set on it (stands in for torch.backends.cuda.matmul / cudnn.conv)."""

    def __init__(self):
        object.__setattr__(self, "set", {})

    def __setattr__(self, name, value):
        self.set[name] = value


@pytest.mark.parametrize("tf32,precision", [(True, "tf32"), (False, "ieee")])
def test_tf32_uses_fp32_precision_without_warnings(fake_cuda, tf32, precision):
    """CUDA mocked: apply() sets torch's fp32_precision flags (real ones, warnings as errors)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Hardware(device="cuda", dtype="fp32", tf32=tf32).apply()
    assert torch.backends.cuda.matmul.fp32_precision == precision
    assert torch.backends.cudnn.conv.fp32_precision == precision


def test_tf32_never_touches_the_deprecated_allow_tf32(fake_cuda, monkeypatch):
    """CUDA mocked: the only flags apply() sets are fp32_precision; cudnn.allow_tf32's setter would raise."""
    matmul, conv = _Recorder(), _Recorder()
    monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)
    monkeypatch.setattr(torch.backends.cudnn, "conv", conv)

    def refuse(self, value):
        raise AssertionError("allow_tf32 set")

    monkeypatch.setattr(type(torch.backends.cudnn), "allow_tf32", property(lambda self: False, refuse))
    Hardware(device="cuda", dtype="fp32", tf32=True).apply()
    assert matmul.set == {"fp32_precision": "tf32"} and conv.set == {"fp32_precision": "tf32"}


# ---- 2. the DDP profiles: GPUs asked of SLURM, or explicitly CPU ---------------------------------------


def test_ddp_profile_asks_slurm_for_one_gpu_per_rank():
    cfg = compose(["launcher=slurm", "hardware=ddp", "hardware.tasks_per_node=4"])
    assert cfg.hardware.device == "cuda" and cfg.hardware.distributed is True
    assert cfg.hydra.launcher.tasks_per_node == 4 and cfg.hydra.launcher.gpus_per_node == 4


def test_ddp_cpu_profile_is_explicitly_cpu():
    cfg = compose(["launcher=slurm", "hardware=ddp_cpu"])
    assert cfg.hardware.device == "cpu" and cfg.hardware.distributed is True
    assert cfg.hydra.launcher.gpus_per_node is None and cfg.hydra.launcher.tasks_per_node == 2
    assert build_hardware(cfg).device == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_ddp_without_cuda_points_to_ddp_cpu():
    with pytest.raises(ConfigError) as err:
        build_hardware(compose(["hardware=ddp"]))
    assert str(err.value) == "hardware.device=cuda: no CUDA device is available here; use hardware=ddp_cpu"


# ---- 15. threads: SLURM_CPUS_PER_TASK is already per rank ---------------------------------------------


def test_threads_for_job(monkeypatch):
    for var in ("SLURM_CPUS_PER_TASK", "GPTLAB_THREADS", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert threads_for_job() == 8 and threads_for_job(2) == 4  # the node's cores shared by its ranks
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "4")
    assert threads_for_job(2) == 4  # SLURM: per task = per rank, not divided again
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    assert threads_for_job(2) == 2  # torchrun inside one SLURM task: its CPUs are shared by the local ranks
    monkeypatch.setenv("GPTLAB_THREADS", "3")
    assert threads_for_job(2) == 3


# ---- 15. local placement: GPUs never shared, CPU wrap-around warned -----------------------------------


def test_local_gpu_slices_never_wrap_around():
    gpus = ["0", "1", "2", "3"]
    assert [placement.gpus_for_job(k, 1, gpus) for k in range(4)] == [["0"], ["1"], ["2"], ["3"]]
    assert [placement.gpus_for_job(k, 2, gpus) for k in range(2)] == [["0", "1"], ["2", "3"]]
    assert placement.gpus_for_job(3, 0, gpus) == [] and placement.gpus_for_job(0, 1, []) == []
    with pytest.raises(ConfigError) as err:
        placement.gpus_for_job(4, 1, gpus)
    assert str(err.value).startswith(
        "hydra.launcher.gpus_per_node=1: this machine has 4 GPU(s), room for 4 run(s) "
        "at a time, but this is run 5 of the local sweep"
    )
    with pytest.raises(ConfigError, match="room for 1 run"):
        placement.gpus_for_job(1, 3, gpus)
    with pytest.raises(ConfigError, match="room for 0 run"):
        placement.gpus_for_job(0, 8, gpus)


def test_place_local_job_refuses_a_shared_gpu(monkeypatch):
    """GPUs mocked through GPTLAB_LAUNCH_GPUS: run 3 of a 2-GPU machine is refused before touching CUDA."""
    monkeypatch.setenv(placement.LAUNCH_GPUS, "0,1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cores: None)
    assert placement.place_local_job(1, None, 1) == {"gpus": ["1"]}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(ConfigError, match="hydra.launcher.gpus_per_node=1"):
        placement.place_local_job(2, None, 1)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_cpu_cores_wrap_around_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="gptlab.runtime.placement"):
        assert [placement.cores_for_job(k, 1, [0, 1]) for k in range(3)] == [[0], [1], [0]]
    assert len(caplog.records) == 1 and "run 2 shares CPU cores [0]" in caplog.records[0].getMessage()
