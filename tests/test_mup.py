"""model.parametrization=mup (gptlab/model/parametrization.py): sp unchanged, muP's init, lr groups and output scale,
a coordinate check across widths, a real run, its refusals, resume and the timing session."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf, open_dict

from gptlab.config.build import build_model, build_optimizer, compose, cost_report, plain_config
from gptlab.config.validate import validate
from gptlab.costs.report import train_flops_per_token
from gptlab.errors import ConfigError
from gptlab.model import parametrization
from gptlab.model.config import GPTConfig
from gptlab.model.fingerprint import model_fingerprint
from gptlab.model.gpt import GPT
from gptlab.optim.schedule import Cosine
from gptlab.train import timing
from gptlab.train.loop import set_lr
from helpers.model import TINY, tiny_model, tokens
from helpers.train import FAST, run_inprocess

MUP = ["model.parametrization=mup", "model.mup_base_width=32"]  # TINY's width 32: m = 1; d_model=128: m = 4
WIDE = ["model.d_model=128"]


def _hidden(model) -> list[torch.nn.Parameter]:
    return [p for b in model.blocks for p in b.parameters() if p.dim() >= 2]


def _train(model, optimizer, steps: int = 3, vocab: int = 61) -> list[float]:
    x = tokens(B=4, T=24, vocab=vocab)
    losses = []
    for _ in range(steps):
        _, loss = model(x, torch.roll(x, -1, 1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _optimizer(model, *overrides: str):
    return build_optimizer(compose([*TINY, *overrides]), model)


# 1. sp is today's model, bit for bit


def test_sp_builds_the_model_and_groups_of_a_config_without_the_keys():
    """The default (sp) and a config without either key: the same init draws, fingerprint, groups and losses."""
    cfg = GPTConfig(n_layer=2, n_head=4, d_model=32, block_size=32, vocab_size=61)
    assert (cfg.parametrization, cfg.mup_base_width) == ("sp", None)
    bare = compose(TINY)
    with open_dict(bare.model):
        bare.model.pop("parametrization"), bare.model.pop("mup_base_width")
    torch.manual_seed(0)
    without = build_model(bare, vocab_size=61)
    with_key = tiny_model("model.parametrization=sp")
    assert without.state_dict().keys() == with_key.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(without.state_dict().values(), with_key.state_dict().values()))
    assert model_fingerprint(without) == model_fingerprint(with_key)
    assert with_key._readout_mult is None and all("mup_q_scale" not in vars(b.attn) for b in with_key.blocks)
    decay, no_decay = ([p for p in with_key.parameters() if (p.dim() >= 2) == d] for d in (True, False))
    today = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]  # before muP
    reference = torch.optim.AdamW(today, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, fused=True)
    assert _optimizer(with_key).param_groups == reference.param_groups
    assert _train(without, build_optimizer(bare, without)) == _train(with_key, _optimizer(with_key))


# 2. muP's init, groups and multipliers


def test_mup_init_scales_hidden_matrices_by_one_over_root_m_and_nothing_else():
    """Same seed: at m = 4 every hidden matrix is sp's x 1/2 exactly; embeddings and norm gains are sp's bits."""
    sp, mup = tiny_model(*WIDE), tiny_model(*WIDE, *MUP)
    assert parametrization.width_multiplier(mup) == 4.0
    hidden = {id(p) for p in _hidden(mup)}
    for (name, a), b in zip(sp.named_parameters(), mup.parameters()):
        expected = a * 0.5 if id(b) in hidden else a
        assert torch.equal(expected, b), name
    assert mup.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.02 / 2, rel=0.05)
    assert mup._readout_mult == 0.25 and mup.blocks[0].attn.mup_q_scale == 1 / math.sqrt(32)


def test_mup_groups_carry_lr_mult_and_set_lr_honours_them_over_a_schedule():
    model = tiny_model(*WIDE, *MUP)
    for name, lr in (("adamw", 3e-3), ("lion", 5e-4)):
        optimizer = _optimizer(model, *WIDE, *MUP, f"optimizer={name}")
        groups = optimizer.param_groups
        assert [g["lr_mult"] for g in groups] == [1.0, 1.0, 0.25]  # the first (logged as train/lr) at the base lr
        assert {id(p) for p in groups[2]["params"]} == {id(p) for p in _hidden(model)}
        assert model.wte.weight in groups[0]["params"] and groups[1]["weight_decay"] == 0.0
        assert all(p.dim() < 2 for p in groups[1]["params"])
        assert groups[2]["weight_decay"] == pytest.approx(0.1 * 4) and groups[0]["weight_decay"] == 0.1
        assert [g["lr"] for g in groups] == [lr, lr, lr / 4]  # the optimizer as built is already muP
        run = SimpleNamespace(schedule=Cosine(max_steps=20, warmup_steps=3), optimizer=optimizer)
        for step in (0, 2, 3, 10, 19):
            set_lr(run, step)
            for g in groups:
                assert g["lr"] == pytest.approx(lr * g["lr_mult"] * run.schedule(step), rel=1e-12)


def test_at_m_1_mup_is_sp_but_for_the_attention_scale():
    """Base width = d_model: the same init bits, the same lrs (per group) and, with the 1/head_dim scale undone, the
    same losses as sp; with it, other losses."""
    sp, mup = tiny_model(), tiny_model(*MUP)
    assert all(torch.equal(a, b) for a, b in zip(sp.parameters(), mup.parameters()))
    assert mup._readout_mult is None and {g["lr"] for g in _optimizer(mup, *MUP).param_groups} == {3e-3}
    scaled = _train(tiny_model(*MUP), _optimizer(mup, *MUP))
    for block in mup.blocks:
        block.attn.mup_q_scale = None
    assert _train(mup, _optimizer(mup, *MUP)) == _train(sp, _optimizer(sp))
    assert scaled != _train(tiny_model(), _optimizer(sp))


def test_a_variant_declares_its_roles_and_an_attention_without_the_scale_is_refused():
    from gptlab.model.mlp.gelu import GeluMLP
    from gptlab.model.norm.rmsnorm import rmsnorm
    from gptlab.model.position.rope import RotaryPosition
    from helpers.readme_attention import ReadmeAttention

    model = tiny_model(*WIDE, *MUP)
    mlp = model.blocks[0].mlp
    mlp.mup_roles = lambda: {"up.weight": "vector"}  # a variant that says its input matrix is vector-like
    assert parametrization.roles(model)[id(mlp.up.weight)] == "vector"
    mlp.mup_roles = lambda: {"gate.weight": "hidden"}
    with pytest.raises(ConfigError, match=r"^model.parametrization=mup: GeluMLP.mup_roles\(\) names 'gate.weight'"):
        parametrization.roles(model)
    cfg = GPTConfig(
        n_layer=1, n_head=2, d_model=16, block_size=8, vocab_size=11, parametrization="mup", mup_base_width=8
    )
    with pytest.raises(ConfigError, match=r"^model.parametrization=mup: attention ReadmeAttention cannot score"):
        GPT(cfg, attention=ReadmeAttention, mlp=GeluMLP, norm=rmsnorm, position=RotaryPosition)


# 3. the coordinate check


def _coordinates(param: str, width: int, seed: int) -> dict[str, float]:
    """Mean |x| of each block's output and of the logits after 8 AdamW steps at lr 1e-2 (head_dim 16, 2 layers)."""
    overrides = ["~data", "model.n_layer=2", f"model.n_head={width // 16}", f"model.d_model={width}",
                 "model.block_size=32", f"model.parametrization={param}", "optimizer.lr=1e-2", "optimizer.weight_decay=0"]  # fmt: skip
    cfg = compose([*overrides, *(["model.mup_base_width=64"] if param == "mup" else [])])
    torch.manual_seed(seed)
    model = build_model(cfg, vocab_size=64)
    x = torch.randint(0, 64, (16, 32), generator=torch.Generator().manual_seed(seed + 1))
    _train_on(model, build_optimizer(cfg, model), x)
    seen: dict[str, float] = {}
    for i, block in enumerate(model.blocks):
        block.register_forward_hook(lambda m, inp, out, k=f"block{i}": seen.__setitem__(k, out.abs().mean().item()))
    with torch.no_grad():
        seen["logits"] = model(x)[0].abs().mean().item()
    return seen


def _train_on(model, optimizer, x: torch.Tensor, steps: int = 8) -> None:
    for _ in range(steps):
        model(x, torch.roll(x, -1, 1))[1].backward()
        optimizer.step()
        optimizer.zero_grad()


def test_coordinate_check_mup_is_flat_across_widths_sp_grows():
    """Measured (3 seeds, 64 -> 512): muP's largest / smallest across widths <= 1.75 for every layer; SP's blocks grow
    107-150x and its logits 2.8-3.0x. Asserted with margin: muP within 2.5x, SP's blocks over 20x, logits over 2x."""
    widths = (64, 128, 256, 512)
    for param in ("sp", "mup"):
        scales = [_coordinates(param, w, seed=0) for w in widths]
        for key in scales[0]:
            values = [s[key] for s in scales]
            spread = max(values) / min(values)
            if param == "mup":
                assert spread < 2.5, (key, values)
            else:
                assert values[-1] / values[0] > (2 if key == "logits" else 20), (key, values)


# 4. a real run through the composed config, and its refusals


def test_a_mup_run_trains_and_records_it(tmp_path):
    summary = run_inprocess(tmp_path / "run", *MUP, steps=8, eval_interval=4)  # FAST's d_model 64: m = 2
    rows = [json.loads(r) for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r["val/loss"] for r in rows if "val/loss" in r]
    assert evals[-1] < evals[0] - 0.3
    sp = run_inprocess(tmp_path / "sp", steps=8, eval_interval=4)
    assert summary["flops_per_token"] == sp["flops_per_token"] and summary["params"] == sp["params"]
    assert summary["model_fingerprint"] != sp["model_fingerprint"]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["model.parametrization=mup"], r"^model.mup_base_width=null: model.parametrization=mup scales by d_model"),
        ([*MUP[:1], "model.mup_base_width=0"], r"^model.mup_base_width=0: must be >= 1"),
        ([*MUP[:1], "model.mup_base_width=-64"], r"^model.mup_base_width=-64: must be >= 1"),
        (["model.parametrization=mu"], r"^model.parametrization: 'mu' is not allowed; allowed: sp, mup"),
        (
            [*MUP, "optimizer=sgd"],
            r"^optimizer=sgd: model.parametrization=mup scales .*; allowed: optimizer=adamw or lion",
        ),
        ([*MUP, "optimizer=muon"], r"^optimizer=muon: model.parametrization=mup"),
        (["model.mup_base_width=64"], r"^model.mup_base_width=64 has no effect with model.parametrization=sp"),
    ],
)
def test_bad_input_is_one_line_naming_the_key(overrides, message):
    cfg = compose([*FAST, *overrides])
    with pytest.raises(ConfigError, match=message) as err:
        validate(cfg)
    assert "\n" not in str(err.value)


def test_costs_are_the_same_under_sp_and_mup():
    sp, mup = compose([*FAST]), compose([*FAST, *MUP])
    reports = [cost_report(c, batch_size=8, seq_len=64, vocab_size=65).to_dict() for c in (sp, mup)]
    assert reports[0] == reports[1]
    models = [build_model(c, vocab_size=65, device="meta") for c in (sp, mup)]
    assert train_flops_per_token(models[0], 64) == train_flops_per_token(models[1], 64)


# 5. resume and the timing session


def test_resume_refuses_a_changed_parametrization(tmp_path):
    run = tmp_path / "run"
    run_inprocess(run, "train.ckpt_interval=2", steps=4, eval_interval=2)
    with pytest.raises(ConfigError, match=r"model.parametrization=sp there, mup here"):
        run_inprocess(run, "train.ckpt_interval=2", *MUP, steps=4, eval_interval=2)


def test_the_timing_session_builds_a_mup_arm_with_mup(tmp_path):
    """timing.build_arm builds the arm as its run did (build_bundle): muP's groups and scales, the run's fingerprint."""
    run = tmp_path / "mup"
    run_inprocess(run, *MUP, "train.prefetch=0", steps=2, eval_interval=2)
    cfg = compose([*FAST, "train.max_steps=2", "train.eval_interval=2", *MUP, "train.prefetch=0"])
    (run / ".hydra").mkdir(exist_ok=True)
    OmegaConf.save(OmegaConf.create(plain_config(cfg)), run / ".hydra" / "config.yaml")
    bundle = timing.build_arm(timing.read_arm(timing.Arm("mup", Path(run))), tmp_path / "where")
    assert [g["lr_mult"] for g in bundle.optimizer.param_groups] == [1.0, 1.0, 0.5]
    assert bundle.model._readout_mult == 0.5 and bundle.model.blocks[0].attn.mup_q_scale == 1 / 4


def test_a_checkpoint_from_before_the_keys_resumes_and_a_changed_parametrization_does_not():
    """A run written before model.parametrization existed saved no such key: it trained as sp, so it resumes under sp
    (every in-flight run would have been refused as '<absent> there, sp here'), and is refused under mup."""
    from gptlab.config.build import compose, plain_config
    from gptlab.state.resume import differences

    now = plain_config(compose([]))
    model = {k: v for k, v in now["model"].items() if k not in ("parametrization", "mup_base_width")}
    before = {**now, "model": model}
    assert differences({"config": before}, {"config": now}, ()) == []
    mup = plain_config(compose(["model.parametrization=mup", "model.mup_base_width=32"]))
    found = differences({"config": before}, {"config": mup}, ())
    assert "model.parametrization=sp there, mup here" in found and "model.mup_base_width=None there, 32 here" in found
