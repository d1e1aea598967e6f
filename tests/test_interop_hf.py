"""gptlab's GPT and Hugging Face transformers' GPT-2 compute the same function: weights copied either way give equal
logits and loss (fp32), every component choice is either mapped exactly or refused in one line, and a run goes out
(`gptlab-export --format hf`) and comes in (`train.init_from=hf:`) through real save_pretrained folders, offline."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="gptlab[hf] not installed: make setup installs it")

from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from gptlab.config.build import build_model, compose  # noqa: E402
from gptlab.errors import ConfigError  # noqa: E402
from gptlab.interop import hf  # noqa: E402
from helpers.model import choices  # noqa: E402

TOL = 1e-4  # fp32: the two models run the same ops in a different order (HF's SDPA vs gptlab's naive kernel)
GPT2 = ["experiment=d12", "~data", "model.n_layer=2"]  # GPT-2's architecture at reduced depth
SIZES = {  # HF name: (gptlab model= preset, n_embd, n_head); reduced depth and vocabulary keep it fast
    "gpt2": ("gpt2", 768, 12),
    "gpt2-medium": ("gpt2-medium", 1024, 16),
    "gpt2-large": ("gpt2-large", 1280, 20),
    "gpt2-xl": ("gpt2-xl", 1600, 25),
}


def _gptlab(*overrides: str, vocab: int = 50257, seed: int = 0):
    torch.manual_seed(seed)
    model = build_model(compose([*GPT2, *overrides]), vocab_size=vocab).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a dropped or swapped one shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def _tokens(vocab: int, B: int = 2, T: int = 33) -> torch.Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(1))


def _assert_same(ours, theirs, vocab: int) -> None:
    """Equal logits at every position and equal next-token loss (HF shifts labels itself)."""
    idx = _tokens(vocab)
    with torch.no_grad():
        logits, _ = ours(idx)
        _, loss = ours(idx[:, :-1], idx[:, 1:])
        out = theirs(idx, labels=idx)
    assert logits.shape == out.logits.shape
    torch.testing.assert_close(logits, out.logits, atol=TOL, rtol=0)
    torch.testing.assert_close(loss, out.loss, atol=TOL, rtol=0)
    assert logits.std() > 0.1  # a real signal, not two near-zero outputs


@pytest.mark.parametrize("size", sorted(SIZES))
def test_hf_gpt2_weights_into_gptlab_give_equal_logits_and_loss(size):
    preset, n_embd, n_head = SIZES[size]
    vocab = 50257 if size == "gpt2" else 512
    torch.manual_seed(0)
    theirs = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=n_embd, n_head=n_head, vocab_size=vocab)).eval()
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if ".ln_" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    ours = build_model(compose([*GPT2, f"model={preset}", "model.n_layer=2"]), vocab_size=vocab).eval()
    hf.check_config(theirs.config, ours, "test")
    ours.load_state_dict(hf.from_hf_state(theirs.state_dict(), ours, "test"))
    assert ours.cfg.d_model == n_embd and ours.cfg.n_head == n_head
    _assert_same(ours, theirs, vocab)


@pytest.mark.parametrize("size", sorted(SIZES))
def test_gptlab_weights_into_hf_gpt2_give_equal_logits_and_loss(size):
    preset = SIZES[size][0]
    vocab = 50257 if size == "gpt2" else 512
    ours = _gptlab(f"model={preset}", "model.n_layer=2", vocab=vocab)
    theirs = hf.to_hf(ours)
    assert theirs.config.n_embd == SIZES[size][1] and theirs.config.n_layer == 2
    _assert_same(ours, theirs, vocab)


def test_d12_exports_as_gpt2s_own_config():
    """experiment=d12 is GPT-2 small: the exported config is GPT-2's, bar the exact-kernel GELU name."""
    config = hf.gpt2_config(build_model(compose(["experiment=d12", "~data"]), vocab_size=50257, device="meta"))
    reference = GPT2Config()
    for name in (
        "vocab_size",
        "n_positions",
        "n_embd",
        "n_layer",
        "n_head",
        "layer_norm_epsilon",
        "initializer_range",
        "tie_word_embeddings",
        "scale_attn_weights",
    ):
        assert config[name] == getattr(reference, name), name
    assert config["n_inner"] == 4 * reference.n_embd
    assert reference.activation_function == "gelu_new" and hf.ACTIVATION_IN["gelu_new"] is hf.GeluMLP


# every option of the families GPT-2 is made of: mapped exactly, or refused naming itself
MAPPED = {
    "attention=mha": [],
    "mlp=gelu": [],
    "mlp=relu2": [],
    "norm=layernorm": [],
    "position=learned": [],
    "position=sinusoidal": [],
    "position=none": [],
}
REFUSED = {  # choice: (what the refusal names, further overrides)
    "attention=gqa": ("attention.n_kv_head=2", ["attention.n_kv_head=2"]),  # n_kv_head = n_head would be MHA
    "attention=mqa": ("attention.n_kv_head=1", []),
    "attention=sliding": ("attention.window=", []),
    "attention=hybrid": ("attention.window=", []),
    "mlp=swiglu": ("mlp=swiglu", []),
    "mlp=none": ("mlp=none", ["~mlp.ratio"]),
    "norm=rmsnorm": ("norm=rmsnorm", []),
    "position=rope": ("position=rope", []),
    "position=alibi": ("position=alibi", []),
}
KNOBS_MAPPED = [
    ["model.bias=false", "norm.bias=false"],
    ["model.tie_embeddings=false"],
    ["model.vocab_multiple=64"],
    ["attention.impl=sdpa"],
    ["model.dropout=0.1", "attention.dropout=0.1"],
]
KNOBS_REFUSED = {
    "norm.placement=post": ("norm.placement=post", []),
    "attention.qk_norm=true": ("attention.qk_norm=true", []),
    "mlp.dropout=0.1": ("mlp.dropout=0.1", []),
}


def test_every_choice_of_gpt2s_families_is_listed():
    listed = {*MAPPED, *REFUSED}
    found = {f"{g}={c}" for g in ("attention", "mlp", "norm", "position") for c in choices(g)}
    assert found == listed


SMALL = ["model.d_model=64", "model.n_head=4", "model.block_size=64"]


@pytest.mark.parametrize("overrides", [[c] for c in MAPPED] + KNOBS_MAPPED, ids=str)
def test_mapped_choices_compute_the_same_in_hf(overrides):
    ours = _gptlab(*SMALL, *overrides, vocab=97)
    theirs = hf.to_hf(ours)
    _assert_same(ours, theirs, 97)


@pytest.mark.parametrize(("override", "refusal"), [*REFUSED.items(), *KNOBS_REFUSED.items()], ids=str)
def test_inexpressible_choices_are_refused_in_one_line(override, refusal):
    named, extra = refusal
    model = build_model(compose([*GPT2, *SMALL, override, *extra]), vocab_size=97, device="meta")
    with pytest.raises(ConfigError) as err:
        hf.gpt2_config(model)
    message = str(err.value)
    assert named in message and "cannot express" in message and "\n" not in message


def test_import_refuses_a_different_architecture():
    theirs = GPT2LMHeadModel(GPT2Config(n_layer=3, n_embd=64, n_head=4, vocab_size=97, n_positions=64))
    ours = build_model(compose([*GPT2, *SMALL]), vocab_size=97, device="meta")
    with pytest.raises(ConfigError, match=r"n_layer=3 there, model.n_layer=2 here"):
        hf.check_config(theirs.config, ours, "train.init_from=hf:x")
    exact = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=97, activation_function="gelu"))
    with pytest.raises(ConfigError, match=r"activation_function=gelu there"):
        hf.check_config(exact.config, ours, "k")
    rope = build_model(compose([*GPT2, *SMALL, "position=rope"]), vocab_size=97, device="meta")
    with pytest.raises(ConfigError, match=r"position=rope; HF GPT-2's positions are learned"):
        hf.check_config(exact.config, rope, "k")


def test_import_refuses_weights_the_run_cannot_hold():
    """Biases into a bias-free run only when they are zero; an untied head into a tied run only when equal."""
    theirs = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=97, n_positions=64))
    no_bias = build_model(compose([*GPT2, *SMALL, "model.bias=false"]), vocab_size=97)
    with torch.no_grad():
        theirs.transformer.h[1].mlp.c_fc.bias.fill_(0.5)
    with pytest.raises(ConfigError, match=r"non-zero transformer.h.0.attn.c_attn.bias|non-zero .*c_fc.bias"):
        hf.from_hf_state(theirs.state_dict(), no_bias, "k")
    untied = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=97, tie_word_embeddings=False))
    tied = build_model(compose([*GPT2, *SMALL]), vocab_size=97)
    with pytest.raises(ConfigError, match=r"lm_head differs from its embedding.*model.tie_embeddings=false"):
        hf.from_hf_state(untied.state_dict(), tied, "k")
