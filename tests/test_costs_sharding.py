"""Per-rank memory and communication over N ranks (ddp, fsdp): hand-computed figures, the CLI, a real FSDP2 run."""

from __future__ import annotations

import json
import os

import pytest
import torch

from gptlab.config.build import build_cost_model, build_model, build_optimizer, compose, cost_report, rank_memory
from gptlab.config.costing import flops_report as run
from gptlab.costs.memory import optimizer_state_bytes_per_param
from gptlab.costs.sharding import Sharding, communication, memory_per_rank, param_layout, per_rank, world_sizes
from gptlab.errors import ConfigError
from helpers.cli import cli_env, run_cli
from helpers.paths import REPO

# 2 layers, d 8, 2 heads, vocab 11 (odd: dim 0 of the tied embedding does not split evenly), no biases, RMSNorm:
# wte (11, 8) = 88 | per block: norm1 (8,), qkv (24, 8), proj (8, 8), norm2 (8,), up (32, 8), down (8, 32)
# = 8 + 192 + 64 + 8 + 256 + 256 = 784 | norm_f (8,) = 8 | total 88 + 2*784 + 8 = 1664
TINY = ["model.n_layer=2", "model.d_model=8", "model.n_head=2", "model.block_size=16", "model.vocab_size=11"]
XL = ["model=gpt2-xl", "model.vocab_size=50257", "hardware.dtype=bf16"]
ROOFS = ["hardware.peak_flops=1e12", "hardware.mem_bandwidth=1e11"]
H100 = "gpu='NVIDIA H100 80GB HBM3'"


def _layout(overrides):
    return param_layout(build_cost_model(compose(overrides)))


def _xl_params(d=1600, n_layer=48, vocab=50257) -> int:
    """gpt2-xl as gptlab builds it: per block 12·d² weights + 9·d biases + 2·d RMSNorm weights; tied wte; norm_f."""
    return n_layer * (12 * d * d + 11 * d) + vocab * d + d


def test_tiny_layout_by_hand():
    lay = _layout(TINY)
    assert (lay.total, lay.root, lay.largest_block) == (1664, 88 + 8, 784)
    assert lay.matmul_weights == 2 * (192 + 64 + 256 + 256) + 88  # every nn.Linear weight, the tied LM head once
    # N=2: wte ceil(11/2)=6 rows of 8; the blocks halve exactly; norm_f 4
    assert lay.sharded(2) == 6 * 8 + 784 + 4 == 836
    # N=8: wte 2 rows (16); block: qkv 3 rows (24) + proj 1 (8) + up 4 (32) + down 1 (32) + norms 1+1 = 98; norm_f 1
    assert lay.sharded(8) == 16 + 2 * 98 + 1 == 213 and lay.sharded(8, blocks_only=True) == 196
    assert lay.sharded(1) == lay.total


@pytest.mark.parametrize(
    "overrides",
    [
        TINY,
        [],
        ["model=gpt2"],
        ["model=gpt2", "attention=gqa", "attention.n_kv_head=4", "mlp=swiglu", "position=learned", "model.bias=true"],
    ],
)
def test_param_basis_is_the_real_models_numel(overrides):
    """The skeleton's counts = sum(p.numel()) of the model training builds; its ceil shards = FSDP2's per tensor."""
    cfg = compose(overrides + ["model.vocab_size=50257"] * (overrides != TINY))
    real = build_model(cfg, device="meta")
    lay = param_layout(build_cost_model(cfg))
    assert lay.total == sum(p.numel() for p in real.parameters()) == real.num_params()
    for n in (2, 3, 8):
        assert lay.sharded(n) == sum(-(-p.shape[0] // n) * p[0].numel() for p in real.parameters())
    assert lay.largest_block == max(sum(p.numel() for p in b.parameters()) for b in real.blocks)


def test_tiny_memory_per_rank_by_hand():
    lay = _layout(TINY)
    ddp = memory_per_rank(lay, Sharding("ddp", 8), 1000.0, compute_bytes=2, state_bytes_per_param=8)
    # replicated: 4 + 4 + 8 bytes per param; autocast's bf16 copy of the 1624 matmul-weight elements
    assert (ddp["params_bytes"], ddp["grads_bytes"], ddp["optimizer_bytes"]) == (4 * 1664, 4 * 1664, 8 * 1664)
    assert ddp["autocast_copy_bytes"] == 2 * 1624 and ddp["unsharded_bytes"] == 0
    assert ddp["total_bytes"] == 16 * 1664 + 2 * 1624 + 1000
    fsdp = memory_per_rank(lay, Sharding("fsdp", 8), 1000.0, compute_bytes=2, state_bytes_per_param=8)
    assert (fsdp["params_bytes"], fsdp["grads_bytes"], fsdp["optimizer_bytes"]) == (4 * 213, 4 * 213, 8 * 213)
    # in the last block's backward: root (96) gathered + its bf16 grads, that block + the prefetched one gathered
    # (2 * 784), the block's bf16 grads and their fp32 reduce-scatter input: 2*(96 + 1568) + 2*96 + (2+4)*784
    assert fsdp["unsharded_bytes"] == 8224 and fsdp["autocast_copy_bytes"] == 0
    assert fsdp["total_bytes"] == 16 * 213 + 8224 + 1000
    fp32 = memory_per_rank(lay, Sharding("ddp", 1), 0.0, compute_bytes=4, state_bytes_per_param=8)
    assert fp32["autocast_copy_bytes"] == 0  # no autocast in fp32: the weights are used as they are


def test_fsdp_on_one_rank_keeps_what_ddp_keeps():
    """gptlab.runtime.distributed.shard leaves one process unwrapped: fsdp at N=1 is ddp at N=1, term by term."""
    lay = _layout(XL)
    one = {
        s: memory_per_rank(lay, Sharding(s, 1), 0.0, compute_bytes=2, state_bytes_per_param=8) for s in ("ddp", "fsdp")
    }
    assert one["ddp"] == one["fsdp"] and one["fsdp"]["params_bytes"] == 4 * _xl_params()
    assert one["fsdp"]["unsharded_bytes"] == 0 and one["fsdp"]["autocast_copy_bytes"] > 0


def test_cpu_offload_moves_the_shards_to_the_host():
    lay = _layout(TINY)
    off = memory_per_rank(lay, Sharding("fsdp", 8, cpu_offload=True), 1000.0, compute_bytes=2, state_bytes_per_param=8)
    assert (off["params_bytes"], off["grads_bytes"], off["optimizer_bytes"]) == (0, 0, 0)
    assert off["host_bytes"] == 16 * 213 and off["total_bytes"] == 8224 + 1000
    with pytest.raises(
        ConfigError, match=r"^hardware.cpu_offload=true needs strategy=fsdp \(here ddp\); allowed: false$"
    ):
        Sharding("ddp", 2, cpu_offload=True)


def test_reshard_after_forward_false_keeps_every_block_gathered():
    lay = _layout(TINY + ["model.n_layer=6"])  # root 96, block 784, 6 blocks
    keep = memory_per_rank(
        lay, Sharding("fsdp", 2, reshard_after_forward=False), 0.0, compute_bytes=2, state_bytes_per_param=8
    )
    free = memory_per_rank(lay, Sharding("fsdp", 2), 0.0, compute_bytes=2, state_bytes_per_param=8)
    assert keep["unsharded_bytes"] == 2 * (96 + 6 * 784) + 2 * 96 + 6 * 784
    assert free["unsharded_bytes"] == 2 * (96 + 2 * 784) + 2 * 96 + 6 * 784


def test_communication_formulas():
    lay = _layout(TINY)
    ddp = communication(lay, Sharding("ddp", 8), compute_bytes=2, grad_accum=4)
    assert [c["bytes_per_step"] for c in ddp] == [2 * 7 / 8 * 4 * 1664]  # ring all-reduce of fp32 grads, once a step
    assert communication(lay, Sharding("ddp", 1), compute_bytes=2, grad_accum=1)[0]["bytes_per_step"] == 0
    fsdp = communication(lay, Sharding("fsdp", 8), compute_bytes=2, grad_accum=1)
    # all-gather (N-1)·s·Ps forward, again for the blocks in backward, reduce-scatter (N-1)·r·Ps (fp32)
    assert [c["bytes_per_step"] for c in fsdp] == [7 * 2 * 213, 7 * 2 * 196, 7 * 4 * 213]
    accum = communication(lay, Sharding("fsdp", 8, reduce_bytes=2), compute_bytes=2, grad_accum=3)
    assert [c["bytes_per_step"] for c in accum] == [3 * 7 * 2 * 213, 3 * 7 * 2 * 196, 3 * 7 * 2 * 213]
    kept = communication(lay, Sharding("fsdp", 8, reshard_after_forward=False), compute_bytes=2, grad_accum=1)
    assert kept[1]["bytes_per_step"] == 0


@pytest.mark.parametrize("n", [1, 2, 8])
def test_gpt2_xl_per_rank_by_hand(n):
    """16 bytes/param replicated (ddp) or over ceil-sharded tensors (fsdp); activations at batch/grad_accum/N."""
    p = _xl_params()
    cfg = compose(XL + ["train.grad_accum=2"])
    model = build_cost_model(cfg)
    state = optimizer_state_bytes_per_param(model, build_optimizer(cfg, model))
    assert state == 8.0  # AdamW: two fp32 moments
    d_model, vocab, block = 1600, 50257, 12 * 1600**2 + 11 * 1600
    root = vocab * d_model + d_model  # tied wte + norm_f: the FSDP2 root unit
    # every block tensor has a dim 0 divisible by 1, 2 and 8; wte keeps ceil(50257 / n) rows of 1600
    blocks = 48 * block // n
    sharded = blocks + -(-vocab // n) * d_model + d_model // n
    acts = cost_report(cfg, 32 // (2 * n), 1024, dtype="bf16").memory["activations_bytes"]
    for strategy, kept in (("ddp", p), ("fsdp", sharded)):
        d = per_rank(
            model,
            Sharding(strategy, n),
            batch_size=32,
            grad_accum=2,
            seq_len=1024,
            compute_bytes=2,
            state_bytes_per_param=state,
        )
        mem = d["memory"]
        assert d["params"]["total"] == p == 1_555_817_600 and d["micro_batch"] == 32 // (2 * n)
        assert mem["params_bytes"] + mem["grads_bytes"] + mem["optimizer_bytes"] == 16 * kept
        assert mem["activations_bytes"] == acts
        if strategy == "ddp" or n == 1:  # one fsdp rank runs unwrapped, as ddp does
            # autocast's bf16 copy of every matmul weight (48 x 12·d² and the tied LM head)
            extra = 2 * (48 * 12 * d_model**2 + vocab * d_model)
            sent = 2 * (n - 1) / n * 4 * p  # ring all-reduce of the fp32 grads, once per step (no_sync before)
        else:  # root + 2 blocks gathered, root grads, one block's bf16 grads + fp32 reduce-scatter input; or the root's
            extra = max(2 * (root + 2 * block) + 2 * root + (2 + 4) * block, (2 * 2 + 4) * root)
            sent = 2 * (n - 1) * (2 * sharded + 2 * blocks + 4 * sharded)  # 2 micro-steps x (AG fwd, AG bwd, RS)
        assert mem["total_bytes"] == 16 * kept + extra + acts
        assert d["communication"]["bytes_per_step"] == pytest.approx(sent, rel=1e-12)


def test_smallest_world_size_that_fits():
    """gpt2-xl, batch 40 x 1024 in bf16 on 80 GB (datasheet): ddp needs 4 ranks, fsdp 2 (at batch 32 ddp fits on 2
    since the loss no longer holds an fp32 copy of the logits)."""
    cfg = compose(XL)
    model = build_cost_model(cfg)
    gpu = {"name": "x", "memory_bytes": 80e9, "shared_by_ranks": False, "link_bandwidth": None}
    totals = {}
    for strategy, smallest in (("ddp", 4), ("fsdp", 2)):
        d = {
            n: per_rank(
                model,
                Sharding(strategy, n),
                batch_size=40,
                grad_accum=1,
                seq_len=1024,
                compute_bytes=2,
                state_bytes_per_param=8.0,
                device=gpu,
            )
            for n in (1, 2, 4)
        }
        totals[strategy] = {n: x["memory"]["total_bytes"] for n, x in d.items()}
        assert all(x["device"]["smallest_world_size"] == smallest for x in d.values())
        assert totals[strategy][smallest] <= 80e9 < totals[strategy][smallest // 2]
        assert d[1]["device"]["fits"] is False and d[smallest]["device"]["fits"] is True
    assert totals["fsdp"][2] < totals["ddp"][2] and totals["ddp"][1] == totals["fsdp"][1]
    assert world_sizes(32, 2) == [1, 2, 4, 8, 16] and world_sizes(12, 1) == [1, 2, 3, 4, 6, 12]
    host = {**gpu, "shared_by_ranks": True}  # ranks on one host add up: more ranks never help ddp there
    d = per_rank(
        model,
        Sharding("ddp", 2),
        batch_size=32,
        grad_accum=1,
        seq_len=1024,
        compute_bytes=2,
        state_bytes_per_param=8.0,
        device=host,
    )
    assert d["device"]["need_bytes"] == 2 * d["memory"]["total_bytes"]


def _flops(*args: str) -> dict:
    return json.loads(json.dumps(run(compose(["format=json", *ROOFS, *args], config_name="flops")).to_dict()))


@pytest.mark.parametrize(
    "args,message",
    [
        (["strategy=fsdp", "world_size=0"], "world_size=0: expected a positive integer (ranks)"),
        (["strategy=zero", "world_size=2"], "strategy=zero: not allowed; allowed: ddp, fsdp"),
        (["world_size=2"], "world_size=2: needs a strategy; allowed: strategy=ddp|fsdp"),
        (["strategy=fsdp", "world_size=3"], "batch_size=32 must be divisible by train.grad_accum x world_size = 1 x 3"),
        (["strategy=fsdp", "reduce_dtype=int8"], "reduce_dtype=int8: not allowed; allowed: fp32, bf16, fp16"),
        (["strategy=fsdp", "gpu=H100"], "gpu=H100: not in the GPU table; allowed: NVIDIA B200, "),
        (["strategy=fsdp", "gpu_memory=-1"], "gpu_memory=-1: expected a positive number or null"),
        (
            ["strategy=ddp", "mode=decode"],
            "strategy=ddp: per-rank memory is a training cost; allowed with mode=train only",
        ),
    ],
)
def test_bad_sharding_keys_are_one_line_errors(args, message):
    with pytest.raises(ConfigError) as err:
        _flops(*TINY, *args)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_hardware_keys_are_read_when_the_profile_has_them():
    """hardware=ddp is ddp over nodes x tasks_per_node ranks; hardware.strategy / world_size win when present."""
    d = _flops(*TINY, "hardware=ddp", "gpu_memory=1e9")["sharding"]
    assert (d["strategy"], d["world_size"], d["device"]["memory_bytes"]) == ("ddp", 2, 1e9)
    d = _flops(
        *TINY, "+hardware.strategy=fsdp", "+hardware.world_size=4", "+hardware.reduce_dtype=bf16", "gpu_memory=1e9"
    )["sharding"]
    assert (d["strategy"], d["world_size"], d["reduce_bytes"], d["reshard_after_forward"]) == ("fsdp", 4, 2, True)
    assert _flops(*TINY)["sharding"] is None and _flops(*TINY, "hardware=ddp", "mode=decode")["sharding"] is None


@pytest.mark.skipif(
    not (REPO / "conf" / "hardware" / "fsdp.yaml").exists(), reason="hardware=fsdp not in this checkout"
)
def test_the_fsdp_profile_is_costed_as_it_trains():
    """hardware=fsdp: strategy and reshard_after_forward from the profile, N from world_size, cpu_offload honoured."""
    d = _flops(*XL, "hardware=fsdp", "world_size=8", "gpu=NVIDIA H100 80GB HBM3")["sharding"]
    assert (d["strategy"], d["world_size"], d["reshard_after_forward"], d["reduce_bytes"]) == ("fsdp", 8, True, 4)
    assert d["memory"]["params_bytes"] == 4 * 194_478_600 and d["device"]["fits"] is True
    off = _flops(*XL, "hardware=fsdp", "world_size=8", "hardware.cpu_offload=true", "gpu_memory=8e10")["sharding"]
    assert off["memory"]["host_bytes"] == 16 * 194_478_600 and off["memory"]["params_bytes"] == 0
    keep = _flops(*XL, "hardware=fsdp", "hardware.reshard_after_forward=false", "gpu_memory=8e10")["sharding"]
    assert keep["world_size"] == 2 and keep["communication"]["collectives"][1]["bytes_per_step"] == 0


def test_a_gpu_this_machine_lacks_is_costed_from_its_datasheet():
    """hardware=ddp (cuda) with gpu=NAME: roofs, memory and link from the tables, no GPU needed."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: 'auto' roofs are measured on it")
    cfg = compose(["format=json", *XL, "hardware=ddp", "world_size=8", H100], config_name="flops")
    d = run(cfg).to_dict()
    assert d["hardware"]["peak_flops"] == 989.4e12 and d["hardware"]["mem_bandwidth"] == 3.35e12
    dev, comm = d["sharding"]["device"], d["sharding"]["communication"]
    assert (dev["memory_bytes"], dev["link_bandwidth"]) == (80e9, 450e9)
    assert comm["time_s"] == comm["bytes_per_step"] / 450e9 and comm["bytes_per_step"] == 7 * _xl_params()


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
def test_cli_prints_the_per_rank_table(tmp_path):
    out = run_cli(
        "gptlab.cli.flops",
        *XL,
        "strategy=fsdp",
        "world_size=8",
        "gpu=NVIDIA H100 80GB HBM3",
        *ROOFS,
        cwd=tmp_path,
        env=cli_env(PYTHONPATH=str(REPO), COLUMNS="200"),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    text = " ".join(out.stdout.split())
    expected = _flops(*XL, "strategy=fsdp", "world_size=8", "gpu=NVIDIA H100 80GB HBM3")["sharding"]
    gib = 2**30
    assert "per rank: fsdp over N=8 ranks, micro-batch 4 x 1024 (batch 32 / grad_accum 1 / 8)" in text
    assert f"│ parameters (fp32 master) │ 0.5 │ {expected['memory']['params_bytes'] / 2**20:.3g}MiB │" in text
    assert (
        f"│ total │ {expected['memory']['total_bytes'] / 1_555_817_600:.3g} │ "
        f"{expected['memory']['total_bytes'] / gib:.3g}GiB │" in text
    )
    assert "│ reduce-scatter grads │ (N-1) · 4·Ps │ 1 │" in text and "time at 450 GB/s" in text
    assert (
        f"verdict fits: {expected['memory']['total_bytes'] / gib:.3g}GiB per rank vs 74.5GiB on NVIDIA H100 80GB "
        "HBM3 (datasheet); smallest N that fits: 2 (N tried: 1 2 4 8 16 32)"
    ) in text
    assert list(tmp_path.iterdir()) == []
    bad = run_cli(
        "gptlab.cli.flops",
        *TINY,
        "strategy=fsdp",
        "world_size=0",
        *ROOFS,
        cwd=tmp_path,
        env=cli_env(PYTHONPATH=str(REPO)),
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr.strip() == "error: world_size=0: expected a positive integer (ranks)"


def _fsdp_worker(rank: int, world: int, port: int, out: str) -> None:
    """One gloo rank: FSDP2 per block and at the root (bf16 params, fp32 reduce), one AdamW step; local bytes kept."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor

    from gptlab.runtime import distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = compose(TINY)
    model = build_model(cfg, device="cpu")
    mesh, policy = init_device_mesh("cpu", (world,)), MixedPrecisionPolicy(torch.bfloat16, torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    optimizer = build_optimizer(cfg, model)
    x = torch.randint(0, 11, (2, 16))
    model(x, x)[1].backward()
    optimizer.step()

    def nbytes(t) -> int:
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    params = list(model.parameters())
    kept = {
        "params_bytes": sum(nbytes(p) for p in params),
        "grads_bytes": sum(nbytes(p.grad) for p in params),
        "optimizer_bytes": sum(
            nbytes(t)
            for p in params
            for t in optimizer.state[p].values()
            if isinstance(t, torch.Tensor) and t.shape == p.shape
        ),
    }
    with open(f"{out}/{rank}.json", "w") as f:
        json.dump(kept, f)
    del (
        model,
        optimizer,
        params,
        mesh,
    )  # what holds the process group goes before it (gptlab.runtime.distributed.teardown)
    distributed.teardown()


@pytest.mark.slow
def test_a_real_fsdp2_run_keeps_what_the_model_says(tmp_path):
    """2 gloo ranks, fully_shard: rank 0 (the larger share) keeps exactly the ceil-sharded params, grads, AdamW state."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_fsdp_worker, args=(2, port, str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    expected = memory_per_rank(_layout(TINY), Sharding("fsdp", 2), 0.0, compute_bytes=2, state_bytes_per_param=8)
    for key in ("params_bytes", "grads_bytes", "optimizer_bytes"):
        assert ranks[0][key] == expected[key] == max(r[key] for r in ranks), key
    assert ranks[1]["params_bytes"] == 4 * (1664 - 836)  # the other rank: wte's 5 remaining rows


def test_every_gpu_with_a_memory_figure_has_datasheet_peaks():
    """gpu=NAME takes its roofs from gpus.GPU_TABLE: every name of GPU_SPECS must match there, whole."""
    from gptlab.runtime.gpus import GPU_SPECS, gpu_peaks, gpu_spec

    assert all(gpu_peaks(name) is not None for name in GPU_SPECS)
    assert gpu_spec("NVIDIA  H100 80GB HBM3") is GPU_SPECS["NVIDIA H100 80GB HBM3"] and gpu_spec("H100") is None


FP8_REFUSED = (
    "dtype=fp8: no fp8 peak FLOP/s in the GPU table or measured here; allowed: fp32, bf16, fp16, "
    "or give hardware.peak_flops=<FLOP/s>"
)


@pytest.mark.parametrize("extra", [[H100], [H100, "+hardware.tf32=false"], ["hardware.mem_bandwidth=1e10"]])
def test_fp8_is_never_given_another_dtypes_peak(extra):
    """dtype=fp8 with 'auto' peak: the GPU table has no fp8 figure (and none is measured), so it is refused in one
    line instead of getting the TF32 (494.7e12) or FP32 (66.9e12) peak; a given hardware.peak_flops is used as is."""
    with pytest.raises(ConfigError) as err:
        run(compose([*TINY, "hardware=cpu", "dtype=fp8", *extra], config_name="flops"))
    assert str(err.value) == FP8_REFUSED
    given = run(compose([*TINY, "hardware=cpu", "dtype=fp8", H100, "hardware.peak_flops=1e15"], config_name="flops"))
    assert (given.hardware["peak_flops"], given.hardware["mem_bandwidth"], given.dtype_bytes) == (1e15, 3.35e12, 1)
    bf16 = run(compose([*TINY, "hardware=cpu", "dtype=bf16", H100], config_name="flops"))
    assert bf16.hardware["peak_flops"] == 989.4e12  # the table's own dtypes are unchanged


def test_training_memory_is_one_micro_batch_as_trainings_own_check(monkeypatch):
    """train.grad_accum=4: gptlab-flops sizes activations on the micro-batch 32 / 4, as training's pre-run memory
    check does (the report it hands check_fits); the FLOP totals stay the whole batch's."""
    from types import SimpleNamespace

    from gptlab.train import bundle

    seen = {}
    monkeypatch.setattr(bundle, "check_fits", lambda report, *a, **kw: seen.update(report["memory"]))
    cfg = compose([*TINY, "train.batch_size=32", "train.grad_accum=4"])
    bundle._check_memory(
        cfg,
        SimpleNamespace(dtype="bf16", strategy="ddp", device="cpu"),
        SimpleNamespace(batch_size=32, grad_accum=4, eval_sequences=0),
        SimpleNamespace(seq_len=16, vocab_size=11, val_sets=[]),
        1,
        {},
    )
    accum = _flops(*TINY, "train.batch_size=32", "train.grad_accum=4", "dtype=bf16")
    whole = _flops(*TINY, "train.batch_size=32", "dtype=bf16")
    micro = _flops(*TINY, "train.batch_size=8", "dtype=bf16")
    for key in ("activations_bytes", "train_estimate_bytes"):
        assert accum["memory"][key] == seen[key] == micro["memory"][key] < whole["memory"][key], key
    assert accum["memory"]["micro_batch"] == 8 and accum["flops"] == whole["flops"]
    with pytest.raises(ConfigError) as err:
        _flops(*TINY, "train.batch_size=30", "train.grad_accum=4")
    assert (
        str(err.value)
        == "batch_size=30 must be divisible by train.grad_accum x world_size = 4 x 1; allowed: a multiple of 4"
    )


# The single-device training estimate (gptlab-flops' `train memory`, training's memory check) and ddp's per rank are
# one estimate: autocast's compute-dtype weight copies are counted on both sides (costs.memory.autocast_copy_bytes).
GPT2_8x1024 = ["model=gpt2", "model.vocab_size=50257", "batch_size=8", "seq_len=1024"]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize(
    "overrides", [GPT2_8x1024, [*TINY, "batch_size=8"], [*TINY, "batch_size=8", "train.grad_accum=2"]]
)
def test_the_single_device_estimate_is_ddp_and_fsdp_at_one_rank(overrides, dtype):
    """Same run, one answer: CostReport.memory equals sharding.per_rank's N=1 memory term by term and in total (the
    validation set, memory.eval_bytes, is added by training's check on top of both)."""
    for strategy in ("ddp", "fsdp"):
        d = _flops(*overrides, f"dtype={dtype}", f"strategy={strategy}", "world_size=1")
        one, rank = d["memory"], d["sharding"]["memory"]
        assert one["train_estimate_bytes"] == rank["total_bytes"] and rank["unsharded_bytes"] == 0, strategy
        for key in ("weights_bytes", "grads_bytes", "optimizer_bytes", "autocast_copy_bytes", "activations_bytes"):
            assert one[key] == rank["params_bytes" if key == "weights_bytes" else key], (strategy, key)
        assert (one["autocast_copy_bytes"] > 0) == (dtype == "bf16")


def test_gpt2_at_8x1024_in_bf16_counts_its_autocast_copies():
    """The report that said 5.71 GB (single device) against 5.96 GB (ddp, N=1): both now count the 2·P_matmul copies."""
    d = _flops(*GPT2_8x1024, "dtype=bf16", "strategy=ddp", "world_size=1")
    matmul = 12 * 12 * 768**2 + 50257 * 768  # per layer q, k, v, proj (4·d²) and up, down (8·d²); the tied head once
    assert d["memory"]["train_estimate_bytes"] == d["sharding"]["memory"]["total_bytes"] == 5_960_025_600
    assert d["memory"]["autocast_copy_bytes"] == 2 * matmul == 2 * d["sharding"]["params"]["matmul_weights"]


@pytest.mark.parametrize(("dtype", "copy"), [("bf16", 2), ("fp16", 2), ("fp32", 0)])
def test_autocast_copies_are_every_linear_weight_once_in_the_compute_dtype(dtype, copy):
    """TINY: 2 x (qkv 192 + proj 64 + up 256 + down 256) + the LM head 88 = 1624 matmul elements, tied or not (the
    token table is looked up, never cast: untied it adds 88 parameters and no copy); fp32 keeps no copy."""
    for tie, params in (("true", 1664), ("false", 1664 + 88)):
        report = cost_report(compose([*TINY, f"model.tie_embeddings={tie}"]), 8, 16, dtype=dtype)
        mem = report.memory
        assert report.params["total"] == params and mem["autocast_copy_bytes"] == copy * 1624, tie
        held = mem["weights_bytes"] + mem["grads_bytes"] + mem["optimizer_bytes"] + mem["autocast_copy_bytes"]
        assert mem["train_estimate_bytes"] == held + mem["activations_bytes"]


@pytest.mark.parametrize("tie", ["true", "false"])
def test_autograd_saves_one_bf16_copy_of_every_linear_weight_under_cpu_autocast(tie):
    """A real forward under torch.autocast('cpu', bfloat16): the tensors autograd saves for backward include exactly
    one bf16 copy of each nn.Linear weight (the tied head once), and their bytes are the report's autocast copies."""
    cfg = compose([*TINY, f"model.tie_embeddings={tie}"])
    torch.manual_seed(0)
    model = build_model(cfg, device="cpu")
    weights = {id(m.weight): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}.values()
    saved: list[torch.Tensor] = []
    x = torch.randint(0, 11, (2, 16))
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x, x)[1]
    loss.backward()  # outside autocast, as training runs it

    def copy_of(t: torch.Tensor, w: torch.Tensor) -> bool:  # the saved tensor, or its transposed view, is bf16(w)
        cast = w.detach().to(torch.bfloat16)
        return t.dtype == torch.bfloat16 and (t.equal(cast) or (t.dim() == 2 and t.T.equal(cast)))

    copies = {}  # storage -> bytes: the same copy saved by several ops counts once
    for w in weights:
        found = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved if copy_of(t, w)}
        assert len(found) == 1, tuple(w.shape)
        copies.update(found)
    assert sum(copies.values()) == cost_report(cfg, 2, 16, dtype="bf16").memory["autocast_copy_bytes"]


def test_trainings_memory_check_is_the_ddp_per_rank_estimate(monkeypatch):
    """bundle._check_memory on 2 ddp ranks in bf16 hands check_fits what gptlab-flops strategy=ddp world_size=2 says
    one rank holds, autocast copies included."""
    from types import SimpleNamespace

    from gptlab.train import bundle

    seen = {}
    monkeypatch.setattr(bundle, "check_fits", lambda report, *a, **kw: seen.update(report["memory"]))
    cfg = compose([*TINY, "train.batch_size=8"])
    bundle._check_memory(
        cfg,
        SimpleNamespace(dtype="bf16", strategy="ddp", device="cpu"),
        SimpleNamespace(batch_size=8, grad_accum=1, eval_sequences=0),
        SimpleNamespace(seq_len=16, vocab_size=11, val_sets=[]),
        2,
        {},
    )
    rank = _flops(*TINY, "train.batch_size=8", "seq_len=16", "dtype=bf16", "strategy=ddp", "world_size=2")
    assert seen["train_estimate_bytes"] == rank["sharding"]["memory"]["total_bytes"]
    assert seen["autocast_copy_bytes"] == rank["sharding"]["memory"]["autocast_copy_bytes"] == 2 * 1624


def test_the_autocast_copies_are_shown_where_the_memory_is_broken_down():
    """gptlab-flops' `train memory` line and check_fits' refusal name the copies when there are any (bf16), not in
    fp32; an fsdp rank's check takes the rank's own copies (none: its gathered params are already bf16)."""
    from gptlab.cli.flops_table import _summary_lines
    from gptlab.costs.memory import GIB, check_fits
    from gptlab.train.bundle import per_rank_report

    for dtype, shown in (("bf16", True), ("fp32", False)):
        d = _flops(*TINY, "batch_size=8", f"dtype={dtype}")
        line = next(x for x in _summary_lines(d) if x.startswith("train memory"))
        assert ("+ autocast copies 3.17KiB + activations" in line) == shown, line  # 2 x 1624 bytes
        with pytest.raises(ConfigError) as err:
            check_fits(d, "cpu", available_bytes=1)
        copies = f", autocast copies {2 * 1624 / GIB:.3g} GiB, activations"
        assert (copies in str(err.value)) == shown, str(err.value)
    cfg = compose([*TINY, "train.batch_size=8"])
    whole = cost_report(cfg, 4, 16, dtype="bf16").to_dict()
    share = rank_memory(cfg, Sharding("fsdp", 2), batch_size=8, grad_accum=1, seq_len=16, dtype="bf16")
    rank = per_rank_report(whole, share)["memory"]
    assert whole["memory"]["autocast_copy_bytes"] == 2 * 1624 and rank["autocast_copy_bytes"] == 0
    assert rank["train_estimate_bytes"] == share["total_bytes"]
    # the refusal's parts add up to its total: an fsdp rank's gathered blocks are named too
    parts = ("weights_bytes", "grads_bytes", "optimizer_bytes", "autocast_copy_bytes", "unsharded_bytes")
    assert sum(rank[k] for k in parts) + rank["activations_bytes"] == rank["train_estimate_bytes"]
    assert rank["unsharded_bytes"] == share["unsharded_bytes"] > 0
    with pytest.raises(ConfigError) as err:
        check_fits(per_rank_report(whole, share), "cpu", available_bytes=1)
    assert f", gathered for compute {share['unsharded_bytes'] / GIB:.3g} GiB, activations" in str(err.value)
