"""DDP setup and wrapping (issue 12, items 9 and 14): long timeout, device_id on CUDA, no buffer broadcast.

The CUDA arguments are checked with torch.cuda and init_process_group mocked; the wrapping runs for real
with 2 gloo ranks under torchrun on this CPU.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from gptlab.runtime import distributed
from helpers.cli import cli_env, run_cli
from helpers.ddp_worker import batch, model
from helpers.paths import pythonpath_with_tests


def test_init_args_bind_nccl_to_the_rank_gpu_with_a_long_timeout():
    assert distributed.init_args("cuda:1") == {
        "backend": "nccl",
        "device_id": torch.device("cuda", 1),
        "timeout": timedelta(minutes=30),
    }
    assert distributed.init_args("cpu", timeout_s=60) == {"backend": "gloo", "timeout": timedelta(seconds=60)}


def test_setup_on_cuda_passes_device_id(monkeypatch):
    """torch.cuda.set_device and init_process_group mocked: rank 1 of 2 joins NCCL bound to cuda:1."""
    calls = {}
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.update(kw))
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: calls.update(set_device=index))
    assert distributed.setup("cuda:0") == (1, 2, "cuda:1")
    assert calls == {
        "set_device": 1,
        "backend": "nccl",
        "device_id": torch.device("cuda", 1),
        "timeout": timedelta(seconds=distributed.DEFAULT_TIMEOUT_S),
    }
    assert distributed.DEFAULT_TIMEOUT_S >= 30 * 60  # NCCL's own default (10 min) is shorter than a big checkpoint


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
@pytest.mark.timeout(120)
def test_two_gloo_ranks_share_identical_gradients(tmp_path):
    """2 real gloo ranks: DDP without buffer broadcast, gradients as bucket views, equal to one process's."""
    env = cli_env(OMP_NUM_THREADS="1", PYTHONPATH=pythonpath_with_tests())
    proc = run_cli(
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "helpers.ddp_worker",
        str(tmp_path),
        env=env,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert all(r["world"] == 2 and r["broadcast_buffers"] is False and r["bucket_view"] is True for r in ranks)
    net = model()
    _, loss = net(*batch())
    loss.backward()
    for name, p in net.named_parameters():
        assert torch.equal(ranks[0]["grads"][name], ranks[1]["grads"][name]), name
        torch.testing.assert_close(ranks[0]["grads"][name], p.grad, atol=1e-6, rtol=1e-5)
