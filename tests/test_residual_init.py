"""model.residual_init_std: the residual projections' init, its GPT-2 default and the zero start it offers."""

from __future__ import annotations

import math

import pytest
import torch

from gptlab.errors import ConfigError
from gptlab.model.config import GPTConfig
from gptlab.model.gpt import GPT
from gptlab.model.mlp.none import NoMLP
from gptlab.model.norm.rmsnorm import rmsnorm
from gptlab.model.position.rope import RotaryPosition
from helpers.model import tiny_model
from helpers.readme_attention import ReadmeAttention


def projections(model) -> list[torch.Tensor]:
    """Every attention out and MLP down weight, block by block."""
    return [w for b in model.blocks for w in (b.attn.proj.weight, *([] if b.mlp.empty else [b.mlp.down.weight]))]


@pytest.mark.parametrize("mlp", ["none", "gelu"])
def test_the_default_is_gpt2s_rule_unchanged(mlp):
    """null: attention out (and MLP down) ~ N(0, init_std/√(2·n_layer)), attention-only blocks included."""
    model = tiny_model(f"mlp={mlp}", "model.n_layer=4", "model.d_model=128", "model.init_std=0.1")
    assert model.cfg.residual_init_std is None
    for w in projections(model):
        assert w.std().item() == pytest.approx(0.1 / math.sqrt(8), rel=0.05)  # 0.0354, 16k+ draws per matrix
    assert model.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.1, rel=0.05)


@pytest.mark.parametrize("mlp", ["none", "gelu", "swiglu"])
def test_zero_zeroes_the_projections_and_leaves_every_other_weight_as_drawn(mlp):
    """0: the residual projections are 0 (each block starts as the identity); every other tensor is bit-identical
    to the default build with the same seed, so the knob changes nothing else."""
    base = tiny_model(f"mlp={mlp}", "model.n_layer=3", "model.init_std=0.1")
    zero = tiny_model(f"mlp={mlp}", "model.n_layer=3", "model.init_std=0.1", "model.residual_init_std=0")
    ids = {id(w) for w in projections(zero)}
    assert len(ids) == (3 if mlp == "none" else 6)
    for (name, a), (_, b) in zip(base.named_parameters(), zero.named_parameters()):
        if id(b) in ids:
            assert not b.any() and a.abs().sum() > 0, name
        else:
            assert torch.equal(a, b), name
    x = torch.randint(0, 61, (2, 24), generator=torch.Generator().manual_seed(0))
    h = zero.wte(x)
    for block in zero.blocks:
        torch.testing.assert_close(block(h, zero.position), h, rtol=0, atol=0)  # identity blocks at step 0


def test_a_positive_std_is_drawn_at_that_std():
    model = tiny_model("mlp=none", "model.n_layer=2", "model.d_model=128", "model.residual_init_std=0.05")
    for w in projections(model):
        assert w.std().item() == pytest.approx(0.05, rel=0.05)


def test_a_variant_without_residual_projections_is_refused_only_when_the_knob_is_set():
    """An attention choice that does not name its residual projections cannot honour the knob: one line."""
    parts = dict(attention=ReadmeAttention, mlp=NoMLP, norm=rmsnorm, position=RotaryPosition)
    cfg = dict(n_layer=1, n_head=2, d_model=16, block_size=8, vocab_size=11)
    GPT(GPTConfig(**cfg), **parts)  # the default: fine
    with pytest.raises(ConfigError, match=r"^model.residual_init_std: ReadmeAttention names no residual projections"):
        GPT(GPTConfig(**cfg, residual_init_std=0.0), **parts)


def test_the_key_is_range_checked():
    from gptlab.config.build import compose
    from gptlab.config.schema import SCHEMA

    assert compose(["model.residual_init_std=0"]).model.residual_init_std == 0
    assert not SCHEMA["model.residual_init_std"].contains(-0.1)
