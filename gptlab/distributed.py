"""torch.distributed setup for `hardware.distributed=true`: torchrun env vars, or SLURM tasks via submitit."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

# Collectives wait this long before failing. NCCL's 10-minute default is shorter than rank 0 writing and
# fsyncing a large checkpoint while the other ranks wait in barrier(), which would kill a healthy job.
DEFAULT_TIMEOUT_S = 30 * 60


def setup(device: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[int, int, str]:
    """Join the process group; returns (rank, world size, this rank's device). One process: (0, 1, device)."""
    if "RANK" not in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        import submitit

        submitit.helpers.TorchDistributedEnvironment().export()  # RANK, WORLD_SIZE, MASTER_ADDR/PORT from SLURM
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, device
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(**init_args(device, timeout_s))
    return rank, world, device


def init_args(device: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict:
    """init_process_group arguments: NCCL bound to this rank's GPU (device_id: no guessing, eager init), else gloo."""
    if device.startswith("cuda"):
        return {"backend": "nccl", "device_id": torch.device(device), "timeout": timedelta(seconds=timeout_s)}
    return {"backend": "gloo", "timeout": timedelta(seconds=timeout_s)}


def wrap(model, device: str, world: int):
    """DistributedDataParallel around the model when world > 1 (gradients all-reduced in backward).

    broadcast_buffers=False: the model's buffers (RoPE tables, ALiBi slopes) are constants, identical on every
    rank, so re-sending them before every forward is wasted traffic. gradient_as_bucket_view=True: gradients
    live in DDP's all-reduce buckets instead of being copied in and out (one gradient-sized buffer less).
    """
    if world == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [torch.device(device).index] if device.startswith("cuda") else None
    return DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False, gradient_as_bucket_view=True)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
