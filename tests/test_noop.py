"""noop_choices: one line per config choice that changes nothing, on real composed configs; none for real ablations."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf, open_dict

from gptlab.config.build import compose
from gptlab.config.noop import check_inert, noop_choices, unread_overrides
from gptlab.config.validate import validate
from gptlab.errors import ConfigError
from gptlab.sweep.plan import planned_overrides
from gptlab.sweep.spec import config_name, load_sweep
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
            "attention.global_every=2 has no effect without attention.window (attention=mha): every layer is full "
            "attention; for global layers between windowed ones use attention=hybrid",
        ),
        (
            ["attention=sliding", "attention.window=null"],
            "attention=sliding with attention.window=null is full attention in every layer (no window); set "
            "attention.window (>= 1; attention=sliding's default is 64)",
        ),
        (
            ["attention=hybrid", "attention.window=null", "attention.global_every=null"],
            "attention=hybrid with attention.window=null is full attention in every layer (no window); set "
            "attention.window (>= 1; attention=hybrid's default is 64)",
        ),
        (
            ["attention=hybrid", "attention.window=null"],  # the global_every line (INERT) says it, once
            "attention.global_every=4 has no effect without attention.window (attention=hybrid): every layer is full "
            "attention; for global layers between windowed ones use attention=hybrid",
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
        ["schedule=constant"],  # constant takes no min_lr_ratio at all (refused as a key: see below)
        ["sample.tokens=0"],  # temperature and top_k are in every config: inert only when someone set them
        ["train.spike_factor=3", "train.spike_dump=true", "train.spike_window=9"],
        ["data.tokenizer=bpe", "data.bpe_vocab_size=500"],
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


INERT = [
    (["attention.global_every=2"], "attention.global_every=2 has no effect without attention.window (attention=mha)"),
    (
        ["attention=gqa", "attention.global_layers=[0]"],
        "attention.global_layers=[0] has no effect without attention.window (attention=gqa)",
    ),
    (
        ["train.spike_dump=true"],
        "train.spike_dump=true has no effect with train.spike_factor=null (spike detection off); set "
        "train.spike_factor (> 1, e.g. 3); or drop train.spike_dump",
    ),
    (["train.spike_window=9"], "train.spike_window=9 has no effect with train.spike_factor=null"),
    (
        ["sample.tokens=0", "sample.temperature=0.3"],
        "sample.temperature=0.3 has no effect with sample.tokens=0 (no sample is drawn)",
    ),
    (
        ["sample.temperature=0", "sample.top_k=5"],
        "sample.top_k=5 has no effect with sample.temperature=0 (greedy: always the most likely token)",
    ),
    (["data.bpe_vocab_size=500"], "data.bpe_vocab_size=500 has no effect with data.tokenizer=char"),
    (
        ["data=text", "data.tokenizer=byte", "data.bpe_sample_bytes=2000000"],
        "data.bpe_sample_bytes=2000000 has no effect with data.tokenizer=byte",
    ),
    (
        ["hardware=fsdp_cpu", "hardware.strategy=ddp", "hardware.reshard_after_forward=false"],
        "hardware.reshard_after_forward=false has no effect without FSDP (hardware.strategy=ddp, distributed=true)",
    ),
    (["+hardware.tf32=false"], "hardware.tf32=false has no effect on hardware.device=cpu"),
    (
        ["mlp=swiglu", "mlp.match_params=false", "mlp.multiple_of=128"],
        "mlp.multiple_of=128 has no effect with mlp.match_params=false (the hidden width is ratio·d_model, not "
        "rounded); set mlp.match_params=true; or drop mlp.multiple_of",
    ),
]


@pytest.mark.parametrize("overrides, needle", INERT, ids=[" ".join(o) for o, _ in INERT])
def test_an_inert_key_given_on_the_command_line_is_refused_in_one_line(overrides, needle):
    """The refusal names the key, the option that makes it inert and what to do; the same config from a file (a
    sweep arm's generated config: nothing given on the command line) is a warning, not a refusal."""
    cfg = compose(overrides)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)
    with open_dict(cfg):
        cfg.hydra.overrides.task = []  # as if every key came from a config file
    check_inert(cfg)  # no refusal ...
    warned = noop_choices(cfg)
    always_set = any(
        k in needle for k in ("spike_window=", "temperature=0.3", "top_k=5", "bpe_", "reshard", "tf32", "multiple_of")
    )
    assert warned == [] if always_set else [line for line in warned if needle.split(" has ")[0] in line], warned


def test_a_schedule_knob_of_another_schedule_is_refused_by_the_constructor_signature():
    """Constant takes no min_lr_ratio (nothing decays), cosine no decay_fraction: not silently ignored."""
    for overrides, needle in (
        (
            ["schedule=constant", "+schedule.min_lr_ratio=0.5"],
            "schedule.min_lr_ratio: not a key of this schedule choice (Constant); allowed: warmup_steps",
        ),
        (
            ["schedule=cosine", "+schedule.decay_fraction=0.5"],
            "schedule.decay_fraction: not a key of this schedule choice (Cosine); allowed: warmup_steps, min_lr_ratio",
        ),
    ):
        with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            validate(compose(overrides))
    assert "min_lr_ratio" not in OmegaConf.to_container(compose(["schedule=constant"]).schedule)


def test_unread_overrides_names_what_a_tool_never_reads():
    given = [
        "model=gpt2",
        "attention.window=8",
        "train.batch_size=4",
        "train.max_steps=9",
        "optimizer=muon",
        "optimizer.lr=1",
        "+data.foo=1",
        "hydra.run.dir=x",
        "mode=decode",
    ]
    reads = ("model", "attention", "train.batch_size", "mode")
    assert unread_overrides(given, reads, ("optimizer",)) == ["train.max_steps=9", "optimizer.lr=1", "+data.foo=1"]
