"""mlp=none: attention-only blocks, exact forward, parameter and FLOP formulas, and a real run that learns."""

from __future__ import annotations

import json

import pytest
import torch
from torch.testing import assert_close

from gptlab.config.build import build_model, compose
from gptlab.costs.report import analyze
from helpers.cli import cli_env, run_cli
from helpers.model import TINY, VOCAB, tiny_model, tokens
from helpers.paths import REPO

L, d, T = 2, 32, 32  # TINY: 2 layers, d_model 32, 4 heads, block 32


@pytest.mark.parametrize("placement", ["pre", "post"])
@torch.no_grad()
def test_block_is_x_plus_attention_of_norm(placement):
    """pre: block(x) == x + attn(norm1(x)); post: norm1(x + attn(x)); no second norm, no MLP parameters."""
    model = tiny_model("mlp=none", f"norm.placement={placement}", "model.init_std=0.1")
    x = torch.randn(2, 24, d, generator=torch.Generator().manual_seed(0))  # (B, T, d)
    for block in model.blocks:
        attn, norm, pos = block.attn, block.norm1, model.position
        expected = x + attn(norm(x), pos) if placement == "pre" else norm(x + attn(x, pos))
        assert_close(block(x, pos), expected, rtol=0, atol=0)
        assert block.norm2 is None and not list(block.mlp.parameters()) and block.mlp.hidden == 0
    assert not any("norm2" in n or ".mlp." in n for n, _ in model.named_parameters())


@torch.no_grad()
def test_model_equals_the_same_weights_with_a_zeroed_mlp():
    """The whole GPT with mlp=none == a gelu GPT whose MLP down-projections are zero (same attention weights)."""
    none = tiny_model("mlp=none", "model.init_std=0.1")
    gelu = tiny_model("mlp=gelu", "model.init_std=0.1")
    state = {k: v for k, v in gelu.state_dict().items() if ".mlp." not in k and ".norm2." not in k}
    assert state.keys() == none.state_dict().keys()
    none.load_state_dict(state)
    for block in gelu.blocks:
        block.mlp.down.weight.zero_()
    x = tokens()
    assert_close(none(x)[0], gelu(x)[0], rtol=0, atol=0)


@pytest.mark.parametrize(
    "extra,per_layer_vectors,norm_vectors",
    [
        ([], 0, 1),  # rmsnorm (gain), no biases
        (["model.bias=true"], 4 * d, 1),  # qkv bias 3d + proj bias d
        (["norm=layernorm"], 0, 2),  # layernorm gain + bias
    ],
)
def test_param_count_formula(extra, per_layer_vectors, norm_vectors):
    """params = V·d (tied) + L·(4d² + biases + one norm) + final norm; the gelu model has L·(8d² + norm) more."""
    model = tiny_model("mlp=none", *extra)
    norm = norm_vectors * d
    expected = VOCAB * d + L * (4 * d * d + per_layer_vectors + norm) + norm
    assert model.num_params() == expected
    mlp_bias = (4 * d + d) if per_layer_vectors else 0
    assert tiny_model("mlp=gelu", *extra).num_params() - expected == L * (8 * d * d + mlp_bias + norm)


@pytest.fixture(scope="module")
def flops_json():
    """`gptlab-flops mlp=none ... format=json` on the tiny shape (V 61, B 4, T 32)."""
    args = [
        "mlp=none",
        *TINY[1:],
        f"model.vocab_size={VOCAB}",
        "batch_size=4",
        "format=json",
        "hardware.peak_flops=1e12",
        "hardware.mem_bandwidth=1e11",
    ]
    proc = run_cli("gptlab.cli.flops", *args, cwd=REPO, timeout=120, env=cli_env(OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_gptlab_flops_counts_no_mlp(flops_json):
    """MLP params, FLOPs and bytes are 0; params and train FLOPs/token match the attention-only hand formula."""
    report = flops_json
    per = report["params"]["per_component"]
    assert per["mlp"] == 0 and per["attention"] == L * 4 * d * d and per["norm"] == (L + 1) * d
    assert report["params"]["total"] == VOCAB * d + L * 4 * d * d + (L + 1) * d
    mlp_ops = [op for op in report["ops"] if op["name"].startswith("mlp")]
    assert all(op["flops"] == 0 and op["bytes_naive"] == 0 and op["bytes_fused"] == 0 for op in mlp_ops)
    # 3 x forward matmuls: 2·L·4d² projections + 2·d·V head + 4·L·d·c̄ scores and A·V, c̄ = (T+1)/2 causal
    attention = 4 * L * d * (T + 1) / 2
    assert report["flops"]["forward_per_token"] == pytest.approx(
        2 * L * 4 * d * d + 2 * d * VOCAB + attention, rel=1e-12
    )
    assert report["flops"]["train_per_token"] == pytest.approx(3 * report["flops"]["forward_per_token"], rel=1e-12)
    norms = [op for op in report["ops"] if op["name"] == "norm"]
    assert norms[0]["layers"] == L  # one norm per block (not two)


def test_cost_model_mlp_none_equals_gelu_minus_its_mlp():
    """Per token, gelu's forward matmul FLOPs minus mlp=none's = L·2·8d² (the two MLP matrices), nothing else."""

    def fwd(choice):
        model = build_model(compose([*TINY, f"mlp={choice}"]), vocab_size=VOCAB, device="meta")
        return analyze(model, 4, T).flops["forward_per_token"]

    assert fwd("gelu") - fwd("none") == pytest.approx(L * 2 * 8 * d * d, rel=1e-12)


def test_unfused_residual_is_one_add_per_attention_only_block():
    """elementwise=unfused: gelu blocks pay two residual adds (x + attn, x + mlp), attention-only blocks one."""
    from gptlab.costs.accounting import ELEMENTWISE, Accounting

    def residual(choice):
        model = build_model(compose([*TINY, f"mlp={choice}"]), vocab_size=VOCAB, device="meta")
        ops = analyze(model, 4, T, accounting=Accounting(unfused=tuple(ELEMENTWISE))).ops
        return next(op for op in ops if op["name"] == "residual")

    n = 4 * T  # tokens
    for choice, adds in (("gelu", 2), ("none", 1)):
        op = residual(choice)
        assert op["layers"] == L and op["flops"] == L * adds * n * d  # one FLOP per element, every layer
        assert op["bytes_naive"] == L * adds * 3 * 2 * n * d  # read x and f(x), write the sum; 2-byte elements


def test_training_with_mlp_none_lowers_the_recall_loss(tmp_path):
    """60 fp32 steps of gptlab-train mlp=none on a small recall task lower the fixed validation loss."""
    args = [
        "mlp=none",
        "data=assoc_recall",
        "data.num_keys=16",
        "data.num_values=16",
        "data.num_pairs=4",
        "data.num_queries=4",
        "data.seq_len=16",
        "model.block_size=16",
        "model.d_model=32",
        "model.n_head=2",
        "model.n_layer=2",
        "train.max_steps=60",
        "train.eval_interval=60",
        "train.batch_size=32",
        "train.eval_sequences=64",
        "optimizer.lr=1e-2",
        "schedule.warmup_steps=5",
        "train.ckpt_interval=0",
        "logger=none",
        "sample.tokens=0",
        "hardware.dtype=fp32",
        "hardware.threads=1",
        "hardware.peak_flops=1e12",
        "hardware.mem_bandwidth=1e11",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = run_cli("gptlab.cli.train", *args, cwd=tmp_path, env=cli_env(OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["choices"]["mlp"] == "none"
    vocab = 16 + 16 + 1
    assert summary["params"] == vocab * 32 + 2 * 4 * 32 * 32 + 3 * 32  # tied head, 2 attention-only blocks
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    val = {r["step"]: r["val/loss"] for r in rows if "val/loss" in r}
    assert val[60] < val[0] - 0.3  # from ~ln(33) = 3.5 towards the ~ln(16) a value-only guess gives
