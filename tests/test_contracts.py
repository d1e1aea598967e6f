"""Contracts as code: causality, KV-cache equivalence, gradient flow and dtype over every choice of every group.

Choices are found by globbing conf/<group>/*.yaml; `attention=readme` (tests/helpers/readme_attention.py, written only
from the README's contract) and the deliberately leaking fixtures come from tests/contract_conf via
hydra.searchpath, the way a user's own conf dir would.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
from torch.testing import assert_close

from gptlab.config.build import build_model, compose
from gptlab.errors import ConfigError
from gptlab.model.attention import kernels
from gptlab.model.attention.gqa import GroupedQueryAttention
from gptlab.model.base import CONTRACTS, Attention, KVCache
from gptlab.model.checks import check_model
from gptlab.model.config import GPTConfig
from gptlab.model.gpt import GPT
from gptlab.model.mlp.gelu import GeluMLP
from gptlab.model.norm.rmsnorm import rmsnorm
from gptlab.model.position.rope import RotaryPosition
from helpers.cli import cli_env, run_cli
from helpers.model import TINY, VOCAB, choices, tokens
from helpers.paths import REPO

EXTRA_CONF = REPO / "tests" / "contract_conf"
SEARCH = f"hydra.searchpath=[file://{EXTRA_CONF}]"
GROUPS = ["attention", "mlp", "norm", "position"]
CASES = [(g, c) for g in GROUPS for c in choices(g)] + [("attention", "readme")]
IDS = [f"{g}={c}" for g, c in CASES]


def model_for(group: str, choice: str, *extra: str, seed: int = 0) -> GPT:
    """The tiny fp32 GPT with one choice set; windowed attention gets window 4 so the window matters at T 20."""
    over = [*TINY, SEARCH, f"{group}={choice}", *extra]
    if group == "attention" and compose(over).attention.get("window") is not None:
        over.append("attention.window=4")
    torch.manual_seed(seed)
    return build_model(compose(over), vocab_size=VOCAB).eval()


@torch.no_grad()
def assert_causal(model: GPT, T: int = 20) -> None:
    """Changing token t changes no output before t, and does change output t."""
    x = tokens(T=T)
    base, _ = model(x)
    for t in (1, T // 2, T - 1):
        y = x.clone()
        y[:, t] = (y[:, t] + 1) % VOCAB
        out, _ = model(y)
        assert_close(out[:, :t], base[:, :t], msg=lambda m, t=t: f"changing token {t} moved earlier outputs: {m}")
        assert not torch.allclose(out[:, t], base[:, t]), f"token {t} does not reach its own output"


@torch.no_grad()
def assert_cache_matches(model: GPT, prompt: int = 5, T: int = 17) -> None:
    """Prefill + one token at a time through the KV cache gives the full forward's logits, and the same generation."""
    x = tokens(T=T)
    full, _ = model(x)
    caches = [KVCache() for _ in model.blocks]
    steps = [model(x[:, :prompt], caches=caches)[0]] + [
        model(x[:, t : t + 1], caches=caches)[0] for t in range(prompt, T)
    ]
    assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)
    start = x[:, :prompt]
    cached = model.generate(start, max_new_tokens=12, temperature=0, use_cache=True)
    recomputed = model.generate(start, max_new_tokens=12, temperature=0, use_cache=False)
    assert torch.equal(cached, recomputed)


@pytest.mark.parametrize("group,choice", CASES, ids=IDS)
def test_causal(group, choice):
    assert_causal(model_for(group, choice))


@pytest.mark.parametrize("group,choice", CASES, ids=IDS)
def test_kv_cache_equals_recompute(group, choice):
    assert_cache_matches(model_for(group, choice))


@pytest.mark.parametrize("group,choice", CASES, ids=IDS)
def test_every_parameter_gets_a_finite_nonzero_gradient(group, choice):
    model = model_for(group, choice).train()
    x = tokens()
    _, loss = model(x, x.roll(-1, dims=1))
    loss.backward()
    bad = [
        n
        for n, p in model.named_parameters()
        if p.grad is None or not torch.isfinite(p.grad).all() or not p.grad.abs().sum() > 0
    ]
    assert not bad, f"no, non-finite or all-zero gradient: {bad}"


@pytest.mark.parametrize("group,choice", CASES, ids=IDS)
@torch.no_grad()
def test_bf16_forward_is_close_to_fp32(group, choice):
    """bf16 autocast (how runs train) gives the fp32 logits within 3% of their range; losses within 0.01."""
    model = model_for(group, choice, "model.init_std=0.1")  # larger weights: sharper attention, a real test
    x = tokens(T=32)
    ref, ref_loss = model(x, x.roll(-1, dims=1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low, low_loss = model(x, x.roll(-1, dims=1))
    assert low.dtype == torch.bfloat16
    assert (low.float() - ref).abs().max() <= 0.03 * ref.abs().max()
    assert abs(low_loss.item() - ref_loss.item()) < 0.01


@pytest.mark.parametrize("group,choice", [("mlp", "leaky"), ("position", "leaky")])
def test_the_causality_and_cache_checks_catch_a_leak(group, choice):
    """Fixtures that add the sequence mean (future tokens into the past) fail both checks."""
    model = model_for(group, choice)
    with pytest.raises(AssertionError, match="moved earlier outputs"):
        assert_causal(model)
    with pytest.raises(AssertionError):
        assert_cache_matches(model)


@pytest.mark.parametrize("group,choice", CASES, ids=IDS)
def test_components_carry_their_contract_attributes(group, choice):
    model = model_for(group, choice)
    component = {
        "attention": model.blocks[0].attn,
        "mlp": model.blocks[0].mlp,
        "norm": model.norm_f,
        "position": model.position,
    }[group]
    base, names = CONTRACTS[group]
    assert isinstance(component, base)
    assert all(name in vars(component) for name in names if name != "has_score_bias")
    attn = model.blocks[0].attn
    assert attn.n_head * attn.head_dim == 32 and 4 % attn.n_kv_head == 0
    assert not hasattr(attn, "uses_score_bias")  # the position owns it; nothing is patched on after construction
    check_model(model, vocab_size=VOCAB, seq_len=32, device="cpu", dtype=torch.float32)


def _gpt(attention) -> GPT:
    cfg = GPTConfig(n_layer=1, n_head=2, d_model=16, block_size=16, vocab_size=VOCAB)
    return GPT(cfg, attention=attention, mlp=GeluMLP, norm=rmsnorm, position=RotaryPosition)


class NotAnAttention(nn.Module):
    """Honours the README's shapes but not its base class."""

    def __init__(self, d_model, n_head, block_size, layer_idx, norm, *, bias=False):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x, position, cache=None):
        return self.proj(x)


class SkipsTheBase(GroupedQueryAttention):
    """Subclasses the base but never runs its constructor."""

    def __init__(self, d_model, n_head, block_size, layer_idx, norm, *, bias=False):
        nn.Module.__init__(self)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)


class NoInit(Attention):
    """Forgets init_weights."""

    def forward(self, x, position, cache=None):
        return x


def test_a_component_off_its_contract_is_refused_at_build_in_one_line():
    with pytest.raises(ConfigError) as err:
        _gpt(NotAnAttention)
    assert str(err.value) == (
        "attention: test_contracts.NotAnAttention is not a gptlab.model.base.Attention; "
        "subclass it and call super().__init__ (contract: gptlab/model/__init__.py)"
    )
    with pytest.raises(
        ConfigError,
        match=r"^attention: test_contracts.SkipsTheBase has no n_head, n_kv_head, "
        r"head_dim, window, impl, kernel, dropout; call Attention",
    ):
        _gpt(SkipsTheBase)
    with pytest.raises(TypeError, match="init_weights"):
        _gpt(lambda d, h, b, i, norm, bias=False: NoInit(d, h, b, i))


def test_check_model_refuses_what_cannot_train_in_one_line(monkeypatch):
    model = model_for("attention", "sliding")
    with pytest.raises(
        ConfigError,
        match=r"^model.vocab_size=61 is smaller than the shakespeare tokenizer's "
        r"vocabulary \(65\); set model.vocab_size=null$",
    ):
        check_model(model, vocab_size=65, seq_len=32, device="cpu", dtype=torch.float32, data_name="shakespeare")
    with pytest.raises(ConfigError, match=r"^data sequences of 33 tokens exceed model.block_size=32$"):
        check_model(model, vocab_size=VOCAB, seq_len=33, device="cpu", dtype=torch.float32)
    flash = model_for("attention", "sliding", "attention.impl=flash")
    with pytest.raises(ConfigError, match="attention.impl=flash: the flash backend takes no mask"):
        check_model(flash, vocab_size=VOCAB, seq_len=32, device="cpu", dtype=torch.float32)
    flex = model_for("attention", "mha", "attention.impl=flex")
    check_model(flex, vocab_size=VOCAB, seq_len=32, device="cpu", dtype=torch.float32, training=False)
    # Whether flex trains on the CPU depends on the torch build (2.9's has a CPU backward, 2.13's has not): the
    # probe decides, and training is accepted exactly where the probe's backward ran.
    if kernels.flex_trainable("cpu", torch.float32):
        check_model(flex, vocab_size=VOCAB, seq_len=32, device="cpu", dtype=torch.float32)
    monkeypatch.setattr(kernels, "flex_trainable", lambda device, dtype: False)  # a torch without the backward
    with pytest.raises(ConfigError, match="attention.impl=flex: this torch has no flex_attention backward on cpu"):
        check_model(flex, vocab_size=VOCAB, seq_len=32, device="cpu", dtype=torch.float32)


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
def test_readme_attention_trains_through_gptlab_train(tmp_path):
    """tests/helpers/readme_attention.py, written from the README alone, trains 3 steps through the real CLI."""
    env = cli_env(PYTHONPATH=f"{REPO / 'tests'}:{REPO}", OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0")
    args = [
        SEARCH,
        "attention=readme",
        "logger=none",
        "model.block_size=32",
        "model.d_model=32",
        "model.n_layer=1",
        "model.n_head=2",
        "train.max_steps=3",
        "train.batch_size=4",
        "train.eval_sequences=4",
        "sample.tokens=0",
        "hardware.dtype=fp32",
        "hardware.peak_flops=1e12",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = run_cli("gptlab.cli.train", *args, cwd=tmp_path, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 3
    assert summary["choices"]["attention"] == "readme"
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    val = {r["step"]: r["val/loss"] for r in rows if "val/loss" in r}
    assert val[3] < val[0]  # gradients flowed through it: 3 fp32 steps lower the fixed validation loss
    config = (tmp_path / "run" / ".hydra" / "config.yaml").read_text()
    assert "_target_: helpers.readme_attention.ReadmeAttention" in config
