"""Model zoo: every config choice builds and trains; implementations agree; parameter counts are exact."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from gptlab.config.build import build_model, build_optimizer, compose
from gptlab.model.attention.kernels import IMPLS
from helpers.model import TINY, VOCAB, choices, tiny_model, tokens

GROUPS = ["attention", "mlp", "norm", "position"]
CASES = [(g, c) for g in GROUPS for c in choices(g)]


@pytest.mark.parametrize("group,choice", CASES, ids=[f"{g}={c}" for g, c in CASES])
def test_every_choice_trains(group, choice):
    """Every parameter gets a finite, non-zero gradient; five AdamW steps on one batch lower its loss."""
    cfg = compose([*TINY, f"{group}={choice}", "optimizer=adamw", "optimizer.lr=3e-3"])
    torch.manual_seed(0)
    model = build_model(cfg, vocab_size=VOCAB).train()
    optimizer = build_optimizer(cfg, model)
    x = tokens()
    y = x.roll(-1, dims=1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses = []
    for step in range(5):
        optimizer.zero_grad(set_to_none=True)
        logits, loss = model(x, y)
        assert logits.shape == (*x.shape, VOCAB)
        assert torch.isfinite(loss)
        loss.backward()
        if step == 0:
            missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
            assert not missing, f"no/invalid gradient for {missing}"
            zero = [n for n, p in model.named_parameters() if p.grad.abs().sum() == 0]
            assert not zero, f"zero gradient for {zero}"
        optimizer.step()
        losses.append(loss.item())
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert not unchanged, f"the optimizer did not update {unchanged}"
    assert losses[-1] < losses[0] - 0.05, losses


def _impl_cases():
    out = []
    for att in choices("attention"):
        windowed = compose([*TINY, f"attention={att}"]).attention.window is not None  # once per choice: at collection
        out += [(att, impl) for impl in IMPLS if not (impl == "flash" and windowed)]  # flash refuses a window (below)
    return out


@pytest.mark.parametrize("att,impl", _impl_cases())
@torch.no_grad()
def test_causality(att, impl):
    """Changing token t leaves every output before t unchanged."""
    model = tiny_model(
        f"attention={att}",
        f"attention.impl={impl}",
        "attention.window=4" if att in ("sliding", "hybrid") else f"attention={att}",
    )
    x = tokens(T=20)
    t = 11
    y = x.clone()
    y[:, t] = (y[:, t] + 1) % VOCAB
    a, _ = model(x)
    b, _ = model(y)
    assert_close(a[:, :t], b[:, :t])
    assert not torch.allclose(a[:, t:], b[:, t:])


@pytest.mark.parametrize("att", choices("attention"))
@pytest.mark.parametrize("position", ["rope", "alibi", "learned"])
@torch.no_grad()
def test_impls_agree(att, position):
    """naive ≡ sdpa ≡ flex (≡ flash where it applies) for the same weights."""
    x = tokens(T=24)
    ref, _ = tiny_model(f"attention={att}", f"position={position}", "attention.impl=naive")(x)
    for impl in ("sdpa", "flex", "flash"):
        cfg = compose([*TINY, f"attention={att}", f"position={position}"])
        if impl == "flash" and (cfg.attention.window is not None or position == "alibi"):
            continue
        out, _ = tiny_model(f"attention={att}", f"position={position}", f"attention.impl={impl}")(x)
        assert_close(out, ref, atol=2e-5, rtol=1e-4, msg=f"{impl} differs from naive")


@torch.no_grad()
def test_gqa_with_all_heads_is_mha():
    x = tokens()
    mha, _ = tiny_model("attention=mha")(x)
    gqa, _ = tiny_model("attention=gqa", "attention.n_kv_head=4")(x)  # tiny model has 4 heads
    assert_close(gqa, mha)


@torch.no_grad()
def test_mqa_is_gqa_with_one_kv_head():
    x = tokens()
    mqa, _ = tiny_model("attention=mqa")(x)
    gqa, _ = tiny_model("attention=gqa", "attention.n_kv_head=1")(x)
    assert_close(gqa, mqa)


@pytest.mark.parametrize("impl", ["naive", "sdpa", "flex"])
@torch.no_grad()
def test_sliding_window_at_least_T_is_full(impl):
    x = tokens(T=24)
    full, _ = tiny_model("attention=mha", f"attention.impl={impl}")(x)
    slid, _ = tiny_model("attention=sliding", "attention.window=24", f"attention.impl={impl}")(x)
    assert_close(slid, full)
    short, _ = tiny_model("attention=sliding", "attention.window=4", f"attention.impl={impl}")(x)
    assert not torch.allclose(short, full)


@pytest.mark.parametrize("impl", ["naive", "sdpa", "flex"])
@torch.no_grad()
def test_sliding_window_pattern(impl):
    """Output t depends on inputs s exactly when t - window < s <= t (one layer, no positions)."""
    window, T = 5, 16
    model = tiny_model(
        "attention=sliding", f"attention.window={window}", f"attention.impl={impl}", "position=none", "model.n_layer=1"
    )
    attn, position = model.blocks[0].attn, model.position
    x = torch.randn(1, T, 32)
    base = attn(x, position)
    depends = torch.zeros(T, T, dtype=torch.bool)  # (T out, T in)
    for s in range(T):  # perturb input s, see which outputs move (flex has no CPU backward)
        x2 = x.clone()
        x2[0, s] += 1.0
        depends[:, s] = (attn(x2, position) - base).abs().amax(dim=-1)[0] > 1e-6
    t = torch.arange(T)
    expected = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - window)
    assert torch.equal(depends, expected)


def test_hybrid_layers_ask_the_attention_choice():
    model = tiny_model("attention=hybrid", "attention.window=8", "attention.global_every=2", "model.n_layer=4")
    assert [b.attn.window for b in model.blocks] == [8, None, 8, None]
    model = tiny_model("attention=sliding", "attention.window=8", "attention.global_layers=[0]", "model.n_layer=3")
    assert [b.attn.window for b in model.blocks] == [None, 8, 8]


@pytest.mark.parametrize("att", choices("attention"))
@pytest.mark.parametrize("position", choices("position"))
def test_kv_cache_generation_equals_recompute(att, position):
    model = tiny_model(
        f"attention={att}",
        f"position={position}",
        "attention.window=6" if att in ("sliding", "hybrid") else f"attention={att}",
    )
    prompt = tokens(B=2, T=5)
    cached = model.generate(prompt, max_new_tokens=12, temperature=0, use_cache=True)
    full = model.generate(prompt, max_new_tokens=12, temperature=0, use_cache=False)
    assert torch.equal(cached, full)
    assert cached.shape == (2, 17)


def test_gpt2_param_count_is_exact():
    cfg = compose(["~data", "model=gpt2", "attention=mha", "mlp=gelu", "norm=layernorm", "position=learned"])
    model = build_model(cfg, vocab_size=50257, device="meta")
    assert model.num_params() == 124_439_808
    assert model.num_params(non_embedding=True) == 85_056_000


def _mlp_weight_params(*overrides):
    cfg = compose(["~data", "model=gpt2", *overrides])
    model = build_model(cfg, vocab_size=50257, device="meta")
    mlp = model.blocks[0].mlp
    return sum(p.numel() for p in mlp.parameters() if p.dim() == 2), mlp


@pytest.mark.parametrize("ratio", [4, 3, 2])
def test_swiglu_matches_gelu_params(ratio):
    gelu, _ = _mlp_weight_params("mlp=gelu", f"mlp.ratio={ratio}")
    swiglu, mlp = _mlp_weight_params("mlp=swiglu", f"mlp.ratio={ratio}")
    assert abs(swiglu - gelu) / gelu < 0.01
    assert "params" in mlp.invariant


@pytest.mark.parametrize("mlp", [c for c in choices("mlp") if c != "none"])  # none: attention-only, no ratio
def test_ratio_3_has_25_percent_fewer_mlp_weights(mlp):
    extra = ["mlp.match_params=false"] if mlp == "swiglu" else []
    r4, _ = _mlp_weight_params(f"mlp={mlp}", "mlp.ratio=4", *extra)
    r3, _ = _mlp_weight_params(f"mlp={mlp}", "mlp.ratio=3", *extra)
    assert r3 * 4 == r4 * 3


@pytest.mark.parametrize("size", choices("model"))
def test_every_model_size_builds_on_meta(size):
    cfg = compose(["~data", f"model={size}"])
    model = build_model(cfg, vocab_size=50257, device="meta")
    assert len(model.blocks) == cfg.model.n_layer
    assert model.blocks[0].attn.head_dim * cfg.model.n_head == cfg.model.d_model


def test_gpt2_xl_shape():
    cfg = compose(["~data", "model=gpt2-xl"])
    assert (cfg.model.n_layer, cfg.model.d_model, cfg.model.n_head) == (48, 1600, 25)


@torch.no_grad()
def test_post_norm_placement_differs_from_pre():
    x = tokens()
    pre, _ = tiny_model("norm.placement=pre")(x)
    post, _ = tiny_model("norm.placement=post")(x)
    assert not torch.allclose(pre, post)


@pytest.mark.parametrize("group", ["attention", "mlp", "norm", "position", "optimizer", "schedule", "data"])
def test_misspelt_key_names_the_key_and_the_allowed_ones(group):
    """A key the choice's target cannot take is refused when the config is built, never silently ignored."""
    from gptlab.config.build import build_data, build_optimizer, build_schedule
    from gptlab.errors import ConfigError

    cfg = compose([*TINY[1:], f"+{group}.widnow=4"])  # with the default data choice
    with pytest.raises(ConfigError) as err:
        build_data(cfg, 64)
        model = build_model(cfg, vocab_size=VOCAB)
        build_optimizer(cfg, model)
        build_schedule(cfg, 10)
    message = str(err.value)
    assert message.startswith(f"{group}.widnow: not a key of this {group} choice") and "allowed: " in message
    assert "\n" not in message
