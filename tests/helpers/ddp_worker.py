"""One rank of tests/test_gpu_distributed.py: wrap a tiny GPT, one backward on its shard, save.

torchrun runs it as a module, `-m helpers.ddp_worker`, with tests/ on PYTHONPATH (helpers.paths.pythonpath_with_tests).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from gptlab.config.build import build_model, compose
from gptlab.runtime import distributed

OVERRIDES = [
    "~data",
    "model.n_layer=2",
    "model.n_head=4",
    "model.d_model=32",
    "model.block_size=16",
    "position=rope",
    "attention=gqa",
]
VOCAB, B, T = 61, 4, 16


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch (B, T+1 tokens), the same on every rank and in the single-process reference."""
    idx = torch.randint(0, VOCAB, (B, T + 1), generator=torch.Generator().manual_seed(0))
    return idx[:, :-1], idx[:, 1:]


def model():
    torch.manual_seed(0)
    return build_model(compose(OVERRIDES), vocab_size=VOCAB)


def main(out: Path) -> None:
    torch.set_num_threads(1)
    rank, world, device = distributed.setup("cpu")
    net = model()
    ddp = distributed.data_parallel(net, device, world)
    x, y = batch()
    _, loss = ddp(x[rank::world], y[rank::world])  # equal shards: the mean of rank means is the global mean
    loss.backward()
    torch.save(
        {
            "grads": {n: p.grad for n, p in net.named_parameters()},
            "world": world,
            "broadcast_buffers": ddp.broadcast_buffers,
            "bucket_view": ddp.gradient_as_bucket_view,
        },
        out / f"rank{rank}.pt",
    )
    del ddp, net, loss  # what holds the process group goes before it (gptlab.runtime.distributed.teardown)
    distributed.teardown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    sys.stdout.flush()
    os._exit(0)  # as gptlab-train's ranks do (gptlab.cli.train._exit_rank): no abort during interpreter shutdown
