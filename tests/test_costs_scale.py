"""The cost model at scale (one block per distinct layer kind) and the memory check before allocating."""

from __future__ import annotations

import json

import pytest
import torch

from gptlab.config.build import build_cost_model, build_model, build_optimizer, compose, cost_report
from gptlab.costs.memory import GIB, available_memory, check_fits, optimizer_state_bytes_per_param
from gptlab.costs.report import analyze, train_flops_per_token
from gptlab.costs.structure import describe
from gptlab.errors import ConfigError
from helpers.cli import cli_env, run_cli
from helpers.paths import REPO

SMALL = ["model.d_model=64", "model.n_head=8", "model.block_size=32", "model.vocab_size=96"]
SEARCH = f"hydra.searchpath=[file://{REPO / 'tests' / 'contract_conf'}]"
CONFIGS = {
    "default": [],
    "hybrid-every-2": ["attention=hybrid", "attention.window=8", "attention.global_every=2"],
    "hybrid-every-4": ["attention=hybrid", "attention.window=8"],
    "sliding-global-layers": ["attention=sliding", "attention.window=8", "attention.global_layers=[0,4]"],
    "gqa-swiglu-layernorm-learned": [
        "attention=gqa",
        "attention.n_kv_head=2",
        "mlp=swiglu",
        "norm=layernorm",
        "position=learned",
        "model.bias=true",
    ],
    "alibi-naive-qknorm-ckpt": [
        "position=alibi",
        "attention.impl=naive",
        "attention.qk_norm=true",
        "hardware.activation_checkpointing=true",
    ],
    "muon": ["optimizer=muon"],  # state bytes differ between matrices and vectors: the skeleton must weight them
    "readme-attention": [SEARCH, "attention=readme"],  # no layer_key: every layer its own kind
}


def _full_report(cfg, batch: int, seq: int, mode: str):
    """What gptlab-flops computed before: every layer built on the meta device."""
    model = build_model(cfg, device="meta")
    state = optimizer_state_bytes_per_param(model, build_optimizer(cfg, model))
    return model, analyze(
        model,
        batch,
        seq,
        mode=mode,
        dtype_bytes="bf16",
        optimizer_state_bytes_per_param=state,
        activation_checkpointing=bool(cfg.hardware.activation_checkpointing),
    )


@pytest.mark.parametrize("name", CONFIGS)
def test_one_block_per_layer_kind_costs_exactly_what_the_full_build_does(name):
    """n_layer 1..6: params, FLOPs, bytes, KV cache, memory and every op row are equal, for every mode."""
    for n_layer in range(1, 7):
        cfg = compose([*SMALL, f"model.n_layer={n_layer}", *CONFIGS[name]])
        for mode in ("train", "decode"):
            full_model, full = _full_report(cfg, 2, 32, mode)
            assert cost_report(cfg, 2, 32, mode=mode, dtype="bf16").to_dict() == full.to_dict(), (n_layer, mode)
        skeleton = build_cost_model(cfg)
        assert describe(skeleton) == describe(full_model)
        assert skeleton.num_params() == full_model.num_params()
        kinds = {b.attn.window for b in full_model.blocks}
        assert len(skeleton.blocks) == (n_layer if name == "readme-attention" else len(kinds))
        assert sum(skeleton.layer_counts) == n_layer
        assert train_flops_per_token(skeleton, 32) == train_flops_per_token(full_model, 32)


def test_a_skeleton_cannot_be_run():
    skeleton = build_cost_model(compose([*SMALL, "model.n_layer=8", "attention=hybrid", "attention.window=8"]))
    assert skeleton.layer_counts == (6, 2) and [b.attn.window for b in skeleton.blocks] == [8, None]
    with pytest.raises(RuntimeError, match="cost-model skeleton"):
        skeleton(torch.zeros(1, 4, dtype=torch.long))


def _flops_cli(*args: str, cwd) -> dict:
    """gptlab-flops' JSON report, from the CLI run as a subprocess."""
    out = run_cli(
        "gptlab.cli.flops",
        "format=json",
        "hardware.peak_flops=1e12",
        "hardware.mem_bandwidth=2e10",
        *args,
        cwd=cwd,
        env=cli_env(PYTHONPATH=str(REPO)),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def _flops_inprocess(*args: str) -> dict:
    from gptlab.config.costing import flops_report as run

    cfg = compose(
        ["format=json", "hardware.peak_flops=1e12", "hardware.mem_bandwidth=2e10", *args], config_name="flops"
    )
    return json.loads(json.dumps(run(cfg).to_dict()))


QUANTITIES = [
    "params.total",
    "params.non_embedding",
    "flops.forward_total",
    "flops.train_per_token",
    "bytes.fused_total",
    "bytes.naive_total",
    "kv_cache.bytes_per_token",
    "memory.train_estimate_bytes",
    "memory.activations_bytes",
    "time.lower_bound_s",
]


def _get(d: dict, dotted: str) -> float:
    for part in dotted.split("."):
        d = d[part]
    return d


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
def test_gptlab_flops_costs_100000_layers_and_every_figure_is_linear_in_n_layer(tmp_path):
    """The CLI at n_layer 10⁵ (hybrid: 75,000 windowed + 25,000 global layers) = a + b·n_layer from n_layer 4 and 8."""
    over = ["attention=hybrid", "attention.window=16", "batch_size=2", "seq_len=64", "hardware.dtype=bf16"]
    big = _flops_cli("model.n_layer=100000", *over, cwd=tmp_path)
    small = {n: _flops_inprocess(f"model.n_layer={n}", *over) for n in (4, 8)}
    for key in QUANTITIES:
        per_layer = (_get(small[8], key) - _get(small[4], key)) / 4
        fixed = _get(small[4], key) - 4 * per_layer
        assert per_layer > 0, key
        assert _get(big, key) == pytest.approx(fixed + 100_000 * per_layer, rel=1e-9), key
    scores = next(op for op in big["ops"] if op["name"] == "attn.scores")
    assert scores["layers"] == 100_000


def _xl_report(batch: int = 8):
    cfg = compose(["model=gpt2-xl", f"train.batch_size={batch}"])
    return cost_report(cfg, batch, 1024, vocab_size=50257, dtype="fp32")


def test_check_fits_refuses_gpt2_xl_with_both_numbers_in_one_line():
    report = _xl_report()
    need = report.memory["train_estimate_bytes"]
    # 1.56 B params: fp32 weights + grads + AdamW's two moments = 16 bytes each, plus activations
    assert need > 16 * report.params["total"] > 23 * GIB
    with pytest.raises(ConfigError) as err:
        check_fits(report, "cpu", available_bytes=8 * GIB, label="model=gpt2-xl")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"model=gpt2-xl needs ~{need / GIB:.3g} GiB for training at batch 8 x 1024 tokens")
    assert "; 8 GiB available on cpu (given); lower train.batch_size" in message
    check_fits(report, "cpu", available_bytes=int(need) + 1)  # fits: no error
    with pytest.raises(ConfigError, match=rf"needs ~{2 * need / GIB:.3g} GiB \(2 processes x {need / GIB:.3g} GiB\)"):
        check_fits(report, "cpu", available_bytes=int(need) + 1, processes=2)


def test_check_fits_reads_memavailable_on_cpu():
    """No number given: /proc/meminfo's MemAvailable, as a separate parse of the file reads it."""
    fields = dict(line.split(":", 1) for line in open("/proc/meminfo").read().splitlines())
    expected = int(fields["MemAvailable"].split()[0]) * 1024
    free, source = available_memory("cpu")
    assert source == "MemAvailable" and abs(free - expected) < 0.05 * expected + 64 * 2**20
    check_fits(cost_report(compose([*SMALL, "model.n_layer=2"]), 4, 32, dtype="fp32"), "cpu")  # a few MiB fits
    huge = cost_report(compose(["model=gpt2-xl", "model.n_layer=4800"]), 8, 1024, vocab_size=50257, dtype="fp32")
    with pytest.raises(ConfigError, match=r"available on cpu \(MemAvailable\)"):
        check_fits(huge, "cpu", label="model=gpt2-xl")


def test_check_fits_asks_cuda_for_free_memory(monkeypatch):
    """torch.cuda.mem_get_info is mocked (this machine has no GPU): 2 GiB free of 80 refuses gpt2-xl."""
    asked = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: asked.append(device) or (2 * GIB, 80 * GIB))
    with pytest.raises(ConfigError, match=r"; 2 GiB available on cuda:1 \(torch.cuda.mem_get_info\); "):
        check_fits(_xl_report(batch=1), "cuda:1", label="model=gpt2-xl")
    assert asked == [torch.device("cuda:1")]


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
def test_the_run_check_uses_gptlab_flops_own_estimate(tmp_path):
    """build.cost_report (what gptlab-train checks) and gptlab-flops give the same training-memory estimate."""
    cli = _flops_cli("model=gpt2-xl", "batch_size=8", "hardware.dtype=fp32", cwd=tmp_path)
    assert cli["memory"] == _xl_report().memory
