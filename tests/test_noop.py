"""noop_choices: one line per config choice that changes nothing, on real composed configs; none for real ablations."""

from __future__ import annotations

import pytest

from gptlab.cli.sweep import config_name, load_sweep, planned_overrides
from gptlab.config.build import compose
from gptlab.config.noop import noop_choices
from gptlab.util.paths import SWEEPS_DIR


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["model=tiny", "attention=gqa"], "attention=gqa with attention.n_kv_head=4 == model.n_head=4 is MHA"),
        (
            ["attention=gqa", "model.n_head=8", "model.d_model=256", "attention.n_kv_head=8"],
            "attention=gqa with attention.n_kv_head=8 == model.n_head=8 is MHA",
        ),
        (
            ["attention=mqa", "model.n_head=1", "model.d_model=32"],
            "attention=mqa with attention.n_kv_head=1 == model.n_head=1 is MHA",
        ),
        (
            ["attention=sliding", "attention.window=128"],
            "attention=sliding with attention.window=128 >= model.block_size=128 is full attention",
        ),
        (
            ["attention=sliding", "attention.window=4096"],
            "attention=sliding with attention.window=4096 >= model.block_size=128 is full attention",
        ),
        (
            ["attention=hybrid", "attention.global_every=1"],
            "attention=hybrid with attention.global_every=1 makes every one of model.n_layer=4 layers global: "
            "it is full attention",
        ),
        (
            ["attention=hybrid", "attention.global_every=null", "attention.global_layers=[0,1,2,3]"],
            "attention=hybrid with attention.global_layers=[0, 1, 2, 3] makes every one of model.n_layer=4 layers global",
        ),
        (
            ["attention=hybrid", "attention.global_every=8"],
            "attention=hybrid with attention.global_every=8 makes none of model.n_layer=4 layers global: "
            "it is sliding-window attention (window 64) in every layer",
        ),
        (
            ["attention.global_every=2"],
            "attention=mha with attention.global_every=2 has no effect without attention.window: every layer is full attention",
        ),
        (
            ["mlp=swiglu", "model.d_model=64", "mlp.ratio=1"],
            "mlp=swiglu with mlp.match_params=true is a no-op: 2/3·1·64 rounds up to mlp.multiple_of=64 as 64",
        ),
        (
            ["schedule.warmup_steps=500", "train.max_steps=500"],
            "schedule=cosine with schedule.warmup_steps=500 >= train.max_steps=500 never leaves warmup",
        ),
        (
            ["schedule=linear", "schedule.min_lr_ratio=1.0"],
            "schedule=linear with schedule.min_lr_ratio=1.0 never decays: it is constant after warmup",
        ),
        (
            ["schedule=wsd", "schedule.decay_fraction=0"],
            "schedule=wsd with schedule.decay_fraction=0 never decays: it is constant after warmup",
        ),
    ],
)
def test_a_no_op_choice_gives_exactly_one_line_naming_its_keys(overrides, expected):
    lines = noop_choices(compose(overrides))
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    assert "\n" not in lines[0]


@pytest.mark.parametrize(
    "overrides",
    [
        [],  # the defaults
        ["attention=gqa", "attention.n_kv_head=2"],
        ["attention=mha", "attention.n_kv_head=4"],  # MHA written out is what was asked for
        ["attention=sliding", "attention.window=127"],
        ["attention=hybrid"],  # window 64 < 128, layer 3 global
        ["mlp=swiglu"],  # 2/3 of 512 -> 384
        ["mlp=swiglu", "mlp.match_params=false", "model.d_model=64", "mlp.ratio=1"],
        ["schedule=constant", "schedule.min_lr_ratio=1.0"],  # constant never used min_lr_ratio
        ["schedule.warmup_steps=499", "train.max_steps=500"],
    ],
)
def test_real_choices_give_no_warning(overrides):
    assert noop_choices(compose(overrides)) == []


def test_plain_dicts_and_explicit_choices_work_without_hydra():
    cfg = {"model": {"n_head": 4, "n_layer": 2, "block_size": 64}, "attention": {"n_kv_head": 4, "window": 64}}
    assert noop_choices(cfg, {"attention": "mine"}) == [
        "attention=mine with attention.n_kv_head=4 == model.n_head=4 is MHA",
        "attention=mine with attention.window=64 >= model.block_size=64 is full attention",
    ]
    assert noop_choices(cfg) == [
        "attention with attention.n_kv_head=4 == model.n_head=4 is MHA",
        "attention with attention.window=64 >= model.block_size=64 is full attention",
    ]


@pytest.mark.parametrize("name", sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml")))
def test_no_shipped_sweep_arm_is_a_no_op(name):
    _, spec, _ = load_sweep(name)
    for arm in spec["arms"]:
        assert noop_choices(compose(planned_overrides(name, spec, arm, []), config_name(spec))) == [], arm
