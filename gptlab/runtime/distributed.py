"""torch.distributed for `hardware.distributed=true`: setup (torchrun env vars, or SLURM tasks via submitit), and
the one place that wraps the model for its strategy: DDP, or FSDP2 (`fully_shard`)."""

from __future__ import annotations

import gc
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# Collectives wait this long before failing. NCCL's 10-minute default is shorter than rank 0 writing and
# fsyncing a large checkpoint while the other ranks wait in barrier(), which would kill a healthy job.
DEFAULT_TIMEOUT_S = 30 * 60

# MASTER_PORT of a SLURM job: every rank computes it from the job id alone, in 20000-32767, below Linux's default
# ephemeral range (32768-60999) from which the node's outgoing connections take their local ports. submitit's own
# pick (20000-60000, seeded by the job id) lands in that range ~70 % of the time, and a port one of those connections
# holds fails rank 0's store with EADDRINUSE while the other ranks wait DEFAULT_TIMEOUT_S for it.
MASTER_PORT_BASE, MASTER_PORT_SPAN = 20000, 12768


def setup(device: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[int, int, str]:
    """Join the process group; returns (rank, world size, this rank's device). One process: (0, 1, device)."""
    if "RANK" not in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        export_slurm_env()
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


def topology(world: int) -> tuple[int, int]:
    """(nodes, ranks per node) of a job of `world` ranks, as its launcher set them (torchrun's or submitit's
    LOCAL_WORLD_SIZE: the ranks on this node); one process: (1, 1)."""
    if world <= 1:
        return 1, 1
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("SLURM_NTASKS_PER_NODE") or world)
    local = max(1, min(local, world))
    return -(-world // local), local


def export_slurm_env() -> None:
    """RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR (the job's first node) and MASTER_PORT (master_port) for one
    task of a SLURM job (`srun` / a submitit job with nodes x tasks_per_node tasks), as torchrun would set them;
    a MASTER_ADDR / MASTER_PORT the job script exported is kept (e.g. a node's address on a fast network).
    CUDA_VISIBLE_DEVICES is left alone: every rank sees its node's GPUs and takes cuda:LOCAL_RANK, as under
    torchrun (submitit's default narrows it to the one GPU, after which cuda:LOCAL_RANK would not exist)."""
    import submitit

    os.environ.setdefault("SUBMITIT_EXECUTOR", "slurm")  # set by submitit's sbatch script; not by a plain srun
    kept = {k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT") if k in os.environ}  # the job script's own
    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if job_id.isdigit():  # unique per job, and per task of a job array
        os.environ["MASTER_PORT"] = str(master_port(int(job_id)))
    os.environ.update(kept)


def master_port(job_id: int) -> int:
    """The store's port for a SLURM job: the same on every rank, another for the next job id (MASTER_PORT_BASE)."""
    return MASTER_PORT_BASE + job_id % MASTER_PORT_SPAN


def init_args(device: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict:
    """init_process_group arguments: NCCL bound to this rank's GPU (device_id: no guessing, eager init), else gloo."""
    if device.startswith("cuda"):
        return {"backend": "nccl", "device_id": torch.device(device), "timeout": timedelta(seconds=timeout_s)}
    return {"backend": "gloo", "timeout": timedelta(seconds=timeout_s)}


def wrap(model, hardware, world: int):
    """The module training runs forward/backward through, per `hardware.strategy` (the one place that wraps).

    ddp: `model` compiled in place (hardware.compile: `model.compile()`, so its state-dict keys and checkpoints are
    the eager model's) under DistributedDataParallel when world > 1. fsdp: `model` itself, sharded in place by
    shard(). Build the optimizer AFTER this: fully_shard replaces the parameters.
    """
    if hardware.strategy == "fsdp":
        return shard(model, hardware, world)
    return data_parallel(hardware.compiled(model), hardware.device, world)


def data_parallel(model, device: str, world: int):
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


def shard(model, hardware, world: int):
    """FSDP2 in place: each transformer block, then the root (embeddings, final norm, LM head); returns `model`.

    The order torch's FSDP2 docs and torchtitan use: activation checkpointing (the model's own flag, set before
    this), then torch.compile of each block (in place, so parameter names and checkpoints are unchanged), then
    fully_shard. Mixed precision: parameters all-gathered and computed in the resolved dtype, gradients
    reduce-scattered in fp32. One process is not wrapped (nothing to shard; its curve is one process's), but
    still writes sharded checkpoints, so it resumes on any number of ranks and back.
    """
    from gptlab.runtime.hardware import check_compiles_on_cuda, compile_mode

    if world == 1:
        return hardware.compiled(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mode = compile_mode(hardware.compile)
    if mode is not None and hardware.device.startswith("cuda"):
        check_compiles_on_cuda(torch.device(hardware.device).index, hardware.compile)
    mesh = init_device_mesh(hardware.device.split(":")[0], (world,))
    param_dtype = None if hardware.dtype == "fp32" else hardware.torch_dtype  # None: gather the fp32 params as they are
    options: dict[str, Any] = {
        "mesh": mesh,
        "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32),
        "offload_policy": CPUOffloadPolicy() if hardware.cpu_offload else OffloadPolicy(),
    }
    for block in model.blocks:
        if mode is not None:
            block.compile(mode=mode)
        fully_shard(block, reshard_after_forward=hardware.reshard_after_forward, **options)
    fully_shard(model, **options)  # the root stays gathered from forward to backward (FSDP2's default for the root)
    return model


def clip_grad_norm(parameters, max_norm: float) -> torch.Tensor:
    """clip_grad_norm_ over all ranks' shards, as a 0-dim fp32 tensor on the gradients' device (not read back: no
    host sync). Under FSDP2 the norm is a replicated DTensor (the global norm)."""
    norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    full = getattr(norm, "full_tensor", None)
    return (full() if full is not None else norm).float()


def host_group(device: str, world: int):
    """The process group for a small agreement between ranks (the stop flag): on GPUs a gloo group over CPU tensors,
    so its answer never waits for the GPU's queued work; None (the default group, already gloo) elsewhere or alone.
    Collective: every rank calls it at the same point."""
    if world == 1 or not device.startswith("cuda"):
        return None
    return dist.new_group(backend="gloo")


def teardown() -> None:
    """Leave the process group once nothing holds the wrapped model any more. DDP's reducer and FSDP's mesh keep a
    reference to the group; when theirs is the last one, the group's destructor runs under the GIL and joins gloo's
    worker threads, one of which may be waiting for the GIL to free a finished collective's tensors: the rank hangs
    for good (tests/test_teardown.py checks the order). gc first frees a cycle still holding the model."""
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
