"""hardware=fsdp_cpu: FSDP2 over real gloo ranks on this CPU, and its sharded (DCP) checkpoints.

Two ranks follow one process's curve within TOLERANCE (helpers/fsdp.py says why); a resume on the same world size is
bit-identical; 2 -> 1 and 1 -> 2 ranks continue within the tolerance (DCP reshards); a corrupt newest checkpoint
is skipped; the single-file export is what gptlab-sample loads; checkpointing + compile + FSDP2 on 2 ranks (slow).
There is no GPU here: the CUDA path (bf16 params, fp32 reduce, CPU offload, compile per block before sharding) is
checked with fully_shard and the device mesh mocked; `make gpu-check` runs it on GPUs. SIGKILL at random moments:
test_fsdp_kill.py.
"""

from __future__ import annotations

import logging

import pytest
import torch

from gptlab.cli import export as export_cli
from gptlab.config.trained import load_trained as load_run
from gptlab.errors import ConfigError
from gptlab.runtime import distributed
from gptlab.runtime.hardware import Hardware
from gptlab.state import checkpoint
from helpers.cli import cli_env, run_cli
from helpers.fsdp import ARGS, FSDP, assert_close_curves, curve, interrupted_copy, launch, train, wait
from helpers.gpu_mocks import fake_cuda  # noqa: F401  (a fixture)
from helpers.train import run_inprocess

TORCHRUN = ["torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "gptlab.cli.train"]  # python -m ...


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"two": 2-rank run under torchrun, "one": the same config in one process}: 8 steps, checkpoints at 4 and 8."""
    base = tmp_path_factory.mktemp("fsdp")
    two = base / "two"
    out = run_cli(*TORCHRUN, *ARGS, f"hydra.run.dir={two}", env=cli_env(OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0"))
    assert out.returncode == 0, out.stderr[-3000:]
    run_inprocess(base / "one", *FSDP, steps=8, eval_interval=4)  # one process: not wrapped, same DCP checkpoints
    return {"two": two, "one": base / "one", "base": base}


def test_two_ranks_follow_one_process_and_shard_their_checkpoints(runs):
    worst = assert_close_curves(curve(runs["two"]), curve(runs["one"]))
    print(f"\nmax |2 ranks - 1 process| over 8 steps: {worst:.2e}")
    newest = checkpoint.latest_path(runs["two"])
    assert newest.name == "step_0000008.dcp" and newest.is_dir()
    shards = sorted(newest.glob("__*_0.distcp"))
    assert [p.name for p in shards] == ["__0_0.distcp", "__1_0.distcp"]  # a file per rank...
    whole = (checkpoint.ckpt_dir(runs["one"]) / "step_0000008.dcp" / "__0_0.distcp").stat().st_size
    assert all(p.stat().st_size < 0.6 * whole for p in shards)  # ...each holding about half: sharded, not replicated
    state = checkpoint.load(newest)
    assert state["step"] == 8 and state["identity"]["world"] == 2 and "model" not in state
    assert state["identity"]["config"]["hardware"]["strategy"] == "fsdp"
    assert [p.name for p in sorted(checkpoint.ckpt_dir(runs["one"]).iterdir())] == [
        "step_0000004.dcp",
        "step_0000008.dcp",
    ]


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
def test_resume_on_the_same_world_size_is_bit_identical(runs):
    run = interrupted_copy(runs["two"], runs["base"] / "two-two", keep_step=4)
    wait(launch(run, 2), run)
    assert curve(run) == curve(runs["two"])


def test_resume_two_ranks_on_one_continues_the_curve(runs):
    run = interrupted_copy(runs["two"], runs["base"] / "two-one", keep_step=4)
    run_inprocess(run, *FSDP, steps=8, eval_interval=4)  # train.resume=auto
    assert curve(run)[:6] == curve(runs["two"])[:6]  # rows up to the checkpoint (step 4 and its eval) are kept
    worst = max(
        assert_close_curves(curve(run), curve(runs["two"])), assert_close_curves(curve(run), curve(runs["one"]))
    )
    print(f"\nmax |2 -> 1 resume - uninterrupted (2 ranks or 1 process)|: {worst:.2e}")
    assert checkpoint.load(checkpoint.latest_path(run))["identity"]["world"] == 1


@pytest.mark.slow  # 16 s with a warm inductor cache on an idle machine, 2 min cold and busy
def test_two_ranks_with_activation_checkpointing_and_compile_follow_one_process(runs):
    """The order torch's FSDP2 docs give: checkpointing (the model's flag), compile each block, then fully_shard."""
    run = runs["base"] / "two-ac-compile"
    wait(launch(run, 2, "hardware.activation_checkpointing=true", "hardware.compile=true"), run, timeout=900)
    print(
        f"\nmax |2 ranks, checkpointing + compile - 1 process|: {assert_close_curves(curve(run), curve(runs['one'])):.2e}"
    )


@pytest.mark.parametrize("optimizer", ["adamw", "sgd", "lion", "muon"])
def test_every_optimizer_resumes_exactly_from_a_sharded_checkpoint(tmp_path, optimizer):
    """One process, DCP checkpoints: the moments of each optimizer (Muon's AdamW member too) come back exactly."""
    run_inprocess(tmp_path / "ref", *FSDP, f"optimizer={optimizer}", steps=8, eval_interval=4)
    run = interrupted_copy(tmp_path / "ref", tmp_path / "run", keep_step=4)
    run_inprocess(run, *FSDP, f"optimizer={optimizer}", steps=8, eval_interval=4)
    assert curve(run) == curve(tmp_path / "ref")


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
def test_resume_one_process_on_two_ranks_continues_the_curve(runs):
    run = interrupted_copy(runs["one"], runs["base"] / "one-two", keep_step=4)
    train(run, 2)
    print(f"\nmax |1 -> 2 resume - 1 process|: {assert_close_curves(curve(run), curve(runs['one'])):.2e}")
    assert checkpoint.load(checkpoint.latest_path(run))["identity"]["world"] == 2


def test_a_corrupt_newest_sharded_checkpoint_is_skipped(runs, tmp_path, caplog):
    """A shard cut short (disk corruption) and a stale temp dir that looks newer: resume from the previous one."""
    run = interrupted_copy(runs["two"], tmp_path / "run", keep_step=8)
    shard = checkpoint.ckpt_dir(run) / "step_0000008.dcp" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])
    (checkpoint.ckpt_dir(run) / ".step_0000009.dcp.tmp").mkdir()
    with caplog.at_level(logging.WARNING):
        state = checkpoint.load_latest(run)
    assert state["step"] == 4 and state["dcp"].endswith("step_0000004.dcp")
    assert "__1_0.distcp" in caplog.text and "the metadata says" in caplog.text


def test_a_sharded_checkpoint_of_another_model_is_refused_in_one_line(runs, tmp_path):
    path = checkpoint.ckpt_dir(runs["one"]) / "step_0000004.dcp"
    with pytest.raises(ConfigError) as err:
        run_inprocess(tmp_path / "run", *FSDP, "model.d_model=32", f"train.init_from={path}", steps=6)
    message = str(err.value)
    assert message.startswith(f"train.init_from: checkpoint '{path}' does not fit this model (") and "\n" not in message
    assert "Size mismatch between saved torch.Size([77, 64]) and current: torch.Size([77, 32]) for model.wte" in message


def test_the_export_is_a_single_file_checkpoint_gptlab_sample_loads(runs, tmp_path):
    out = tmp_path / "export"
    path = export_cli.export(runs["two"], out)
    assert path == out / "checkpoints" / "step_0000008.pt" and path.is_file()
    state = checkpoint.load(path)  # weights_only, the single-file format
    assert state["step"] == 8 and "dcp" not in state and state["identity"]["world"] == 2
    exported, _, step = load_run(out)
    direct, _, _ = load_run(runs["two"])  # gptlab-sample on the sharded run dir itself: DCP gathers the shards
    assert step == 8
    for (name, a), (_, b) in zip(exported.state_dict().items(), direct.state_dict().items()):
        assert torch.equal(a, b), name
    moments = state["optimizer"]["state"]
    assert {tuple(s["exp_avg"].shape) for s in moments.values()} == {tuple(p.shape) for p in exported.parameters()}


def test_wandb_uploads_the_newest_sharded_checkpoint_as_a_folder(runs, monkeypatch):
    """logger.wandb.log_checkpoints with fsdp: the artifact is the step_N.dcp dir (W&B itself is faked here)."""
    from types import SimpleNamespace

    import wandb

    from gptlab.sinks.wandb import WandbSink

    got = {}

    class Artifact:
        def __init__(self, name, type, metadata):
            got["metadata"] = metadata

        def add_dir(self, path):
            got["dir"] = path

    monkeypatch.setattr(wandb, "Artifact", Artifact)
    sink = object.__new__(WandbSink)  # only what _log_checkpoint reads
    sink.run_dir, sink.run_id = runs["two"], "x"
    sink.run = SimpleNamespace(log_artifact=lambda artifact, aliases: got.update(aliases=aliases))
    sink._log_checkpoint()
    assert got == {
        "metadata": {"step": 8},
        "dir": str(checkpoint.ckpt_dir(runs["two"]) / "step_0000008.dcp"),
        "aliases": ["latest", "step8"],
    }


@pytest.mark.slow  # 10 s on an idle 2-core machine, 30 s on a busy one: two more rank processes
def test_init_from_a_single_file_into_two_ranks(runs, tmp_path):
    """The export (full tensors, one file) starts a 2-rank fsdp run: each rank keeps its slices of it."""
    path = export_cli.export(runs["two"], tmp_path / "export")
    extra = ["train.max_steps=10", f"train.init_from={path}"]
    two = train(tmp_path / "two", 2, *extra)
    one = run_inprocess(tmp_path / "one", *FSDP, *extra, steps=10, eval_interval=4)
    assert one["steps"] == 10
    print(f"\nmax |init_from on 2 ranks - on 1|: {assert_close_curves(curve(two), curve(tmp_path / 'one')):.2e}")


def test_cuda_fsdp_compiles_then_shards_each_block_then_the_root(monkeypatch):
    """No GPU here: fully_shard and the device mesh are mocked; this is what distributed.wrap asks of them on CUDA."""
    from torch.distributed import device_mesh, fsdp

    from gptlab.config.build import build_model, compose

    calls, compiled = [], []
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, **kw: calls.append((module, kw)))
    monkeypatch.setattr(device_mesh, "init_device_mesh", lambda kind, shape: ("mesh", kind, shape))
    # the Triton / sm_70 check reads the GPU (none here): tests/test_gpu_ready.py checks it with CUDA mocked
    monkeypatch.setattr("gptlab.runtime.hardware.check_compiles_on_cuda", lambda index, value: None)
    model = build_model(compose(["model=tiny"]), vocab_size=64, device="meta")
    for block in model.blocks:
        object.__setattr__(block, "compile", lambda mode, b=block: compiled.append((b, mode, len(calls))))
    hw = Hardware(device="cpu", dtype="bf16", distributed=True, strategy="fsdp", compile=True)
    hw.device, hw.cpu_offload = "cuda:0", True  # as __post_init__ resolves them on a GPU node (its checks need CUDA)
    assert distributed.wrap(model, hw, world=4) is model
    assert [m for m, _ in calls] == [*model.blocks, model]  # each block, then the root
    assert [(b, mode, at) for b, mode, at in compiled] == [(b, "default", i) for i, b in enumerate(model.blocks)]
    for _, kw in calls:
        assert kw["mesh"] == ("mesh", "cuda", (4,))
        assert kw["mp_policy"] == fsdp.MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        assert isinstance(kw["offload_policy"], fsdp.CPUOffloadPolicy)
    assert (
        all(kw["reshard_after_forward"] is True for _, kw in calls[:-1]) and "reshard_after_forward" not in calls[-1][1]
    )


def test_fsdp_in_fp32_gathers_fp32_and_one_process_is_not_wrapped(monkeypatch):
    from torch.distributed import device_mesh, fsdp

    calls = []
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, **kw: calls.append(kw))
    monkeypatch.setattr(device_mesh, "init_device_mesh", lambda kind, shape: ("mesh", kind, shape))
    net = torch.nn.Module()
    net.blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    hw = Hardware(device="cpu", dtype="fp32", distributed=True, strategy="fsdp")
    assert distributed.wrap(net, hw, world=1) is net and calls == []
    distributed.wrap(net, hw, world=2)
    assert calls[0]["mp_policy"] == fsdp.MixedPrecisionPolicy(param_dtype=None, reduce_dtype=torch.float32)
    assert type(calls[0]["offload_policy"]) is fsdp.OffloadPolicy  # no offload


def test_cpu_offload_is_allowed_on_cuda(fake_cuda):
    hw = Hardware(device="cuda", dtype="bf16", distributed=True, strategy="fsdp", cpu_offload=True)
    assert hw.device == "cuda:0" and hw.cpu_offload


def test_fsdp_without_cuda_points_to_fsdp_cpu():
    with pytest.raises(Exception) as err:
        Hardware(device="cuda", distributed=True, strategy="fsdp")
    assert str(err.value) == "hardware.device=cuda: no CUDA device is available here; use hardware=fsdp_cpu"


def test_fsdp_resume_may_change_the_world_size_and_resharding_only():
    from gptlab.config.build import compose
    from gptlab.config.schema import curve_free_keys
    from gptlab.state.resume import differences

    def identity(strategy: str, world: int, reshard: bool = True, lr: float = 0.003) -> dict:
        config = {"hardware": {"strategy": strategy, "reshard_after_forward": reshard}, "optimizer": {"lr": lr}}
        return {"config": config, "choices": {}, "world": world, "dtype": "fp32"}

    free = curve_free_keys(compose(["hardware=fsdp_cpu"]))
    assert differences(identity("fsdp", 2), identity("fsdp", 1, reshard=False), free) == []
    assert differences(identity("ddp", 2), identity("ddp", 1), free) == ["world size=2 there, 1 here"]
    assert differences(identity("fsdp", 2), identity("fsdp", 4, lr=0.01), free) == [
        "optimizer.lr=0.003 there, 0.01 here"
    ]


def test_an_optimizer_without_state_is_saved_and_loaded_as_such(tmp_path):
    """Before any step (all skipped as non-finite) AdamW has no moments: the checkpoint must not invent them."""
    from gptlab.config.build import build_model, compose
    from gptlab.state import sharded

    def fresh():
        torch.manual_seed(0)
        net = build_model(compose(["model=tiny"]), vocab_size=64)
        return net, torch.optim.AdamW(net.parameters(), lr=1e-3)

    net, opt = fresh()
    path = sharded.save(tmp_path, 1, net, opt, {"step": 1}, rank=0, world=1)
    assert opt.state == {} and not sharded._holds_optimizer(path)  # torch's zero-lr step would have made AdamW's
    other, other_opt = fresh()
    sharded.load(path, other, other_opt)
    assert other_opt.state == {} and checkpoint.load(path)["step"] == 1


def test_the_memory_check_of_an_fsdp_run_counts_one_ranks_share():
    """gpt2-xl on 8 ranks: refused where replicated state exceeds the memory, accepted where one rank's share fits."""
    from gptlab.config import build
    from gptlab.costs.memory import check_fits
    from gptlab.costs.sharding import Sharding
    from gptlab.train.bundle import per_rank_report

    cfg = build.compose(["model=gpt2-xl", "hardware=fsdp_cpu", "train.batch_size=8"])
    whole = build.cost_report(cfg, 1, 1024, vocab_size=50304, dtype="bf16").to_dict()
    share = build.rank_memory(cfg, Sharding("fsdp", 8), batch_size=8, grad_accum=1, seq_len=1024, vocab_size=50304)
    rank = per_rank_report(whole, share)
    need, each = whole["memory"]["train_estimate_bytes"], rank["memory"]["train_estimate_bytes"]
    assert each == share["total_bytes"] and each < need / 3  # 16 bytes per param sharded 8 ways, + gathered root
    with pytest.raises(ConfigError, match="lower train.batch_size"):
        check_fits(whole, "cpu", available_bytes=int(each * 1.5))
    check_fits(rank, "cpu", available_bytes=int(each * 1.5))


def test_each_rank_draws_its_own_dropout_stream():
    """The model is built from the seed alike on every rank; the dropout masks must not be alike too (one seed on every
    rank drew the same masks on each rank's own samples). One process keeps drawing from the seed."""
    from gptlab.train.run import own_streams

    draws = []
    for rank in (0, 1):
        torch.manual_seed(3)  # where the model's init leaves every rank
        own_streams(3, rank, 2)
        draws.append(torch.rand(8))
    assert not torch.equal(draws[0], draws[1])
    torch.manual_seed(3)
    own_streams(3, 0, 1)
    alone = torch.rand(8)
    torch.manual_seed(3)
    assert torch.equal(alone, torch.rand(8))


@pytest.mark.slow  # three 2-rank runs (~1 min on 2 cores)
def test_two_ranks_with_dropout_resume_bit_identically_each_on_its_own_stream(tmp_path):
    """With dropout on 2 ranks each rank draws its own masks, so a checkpoint keeps every rank's RNG state and each
    rank resumes its own: the resumed curve equals the uninterrupted one to the bit."""
    full = train(tmp_path / "full", 2, "model.dropout=0.2")
    state = checkpoint.load(checkpoint.ckpt_dir(full) / "step_0000004.dcp")
    assert len(state["rng_ranks"]) == 2 and not torch.equal(*(r["torch"] for r in state["rng_ranks"]))
    run = interrupted_copy(full, tmp_path / "again", keep_step=4)
    wait(launch(run, 2, "model.dropout=0.2"), run)
    assert curve(run) == curve(full)
