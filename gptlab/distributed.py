"""torch.distributed setup for `hardware.distributed=true`: torchrun env vars, or SLURM tasks via submitit."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def setup(device: str) -> tuple[int, int, str]:
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
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return rank, world, device


def wrap(model, device: str, world: int):
    """DistributedDataParallel around the model when world > 1 (gradients all-reduced in backward)."""
    if world == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [torch.device(device).index] if device.startswith("cuda") else None
    return DistributedDataParallel(model, device_ids=ids)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
