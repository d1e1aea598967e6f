"""The settings dataclasses are the schema of their keys (gptlab/config/schema.py derives the checks from them): each field
of TrainSettings, GPTConfig and Hardware is one checked key, a number must declare its range, and the loop's
TrainSettings is filled from exactly the keys the schema checked. There is no other table: SCHEMA is the settings'
fields and GPT's norm.placement; the keys a resume may change are the ones whose rule says curve=False."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import pytest
from omegaconf import open_dict

from gptlab.config.build import build_hardware, build_model, compose, group_choices, model_config, plain_config
from gptlab.config.schema import (
    REQUIRED,
    SCHEMA,
    SETTINGS,
    _derived,
    check_known_keys,
    check_schema,
    curve_free_keys,
    field_checks,
    param_checks,
)
from gptlab.config.settings import TrainSettings, config_key, train_settings
from gptlab.errors import ConfigError
from gptlab.model.config import GPTConfig
from gptlab.model.gpt import GPT, PLACEMENT
from gptlab.runtime.hardware import Hardware
from gptlab.state.resume import differences
from gptlab.util.checks import Bool, Number, OneOf, Text, rule
from gptlab.util.tree import flatten

# resume's hand-written allow-list before the settings carried the curve=False marker (a trailing "." = a subtree)
HAND_LIST = (
    "logger.", "launcher.", "sample.", "name", "sweep", "arm", "profile", "train.resume", "train.init_from",
    "train.log_interval", "train.ckpt_interval", "train.prefetch", "hardware.threads", "hardware.cpus_per_task",
    "data.num_proc", "data.verify", "train.diagnostics", "train.spike_factor", "train.spike_window",
    "train.spike_dump", "train.detect_anomaly", "hardware.reshard_after_forward", "hardware.nodes",
    "hardware.tasks_per_node", "hardware.gpus_per_node",
)  # fmt: skip


@pytest.mark.parametrize("cls, group", [(TrainSettings, "train"), (GPTConfig, "model"), (Hardware, "hardware")])
def test_every_field_is_one_checked_key(cls, group):
    checks = field_checks(cls, group)
    assert len(checks) == len(fields(cls))  # no two fields on one key
    assert all(SCHEMA[key] == check for key, check in checks.items())


def test_checks_follow_the_annotation_and_the_rule():
    assert SCHEMA["train.max_steps"] == Number(">= 1", int)
    assert SCHEMA["train.spike_factor"] == Number("> 1", float, null=True, note="null = off")  # float | None
    assert SCHEMA["sample.top_k"] == Number(">= 1", int, null=True)  # rule(key=...) names the key
    assert SCHEMA["seed"] == Number("[0, 2**63)", int)
    assert SCHEMA["profile"] == Bool() and SCHEMA["train.init_from"] == Text(null=True)
    assert SCHEMA["model.dropout"] == Number("[0, 1)") and SCHEMA["hardware.threads"] == Number(">= 1", int, null=True)
    assert isinstance(SCHEMA["hardware.compile"], OneOf)  # bool | str: the rule's own check


def test_required_keys_are_fields_without_a_default_or_marked_required():
    train = {config_key(f, "train") for f in fields(TrainSettings)} - {"train.init_from", "train.eval_flops"}
    model = {"model.n_layer", "model.n_head", "model.d_model", "model.block_size", "model.dropout", "model.init_std"}
    assert set(REQUIRED) == train | model  # hardware keys all have defaults


def test_a_number_without_a_range_is_refused_when_the_schema_is_built():
    @dataclass
    class Unranged:
        steps: int = 1
        ratio: float = field(default=0.5, metadata=rule("(0, 1)"))

    with pytest.raises(TypeError, match=r"^toy.steps: give the field rule\(spec\)"):
        field_checks(Unranged, "toy")
    assert _derived("toy.ratio", float, rule("(0, 1)")) == Number("(0, 1)")
    with pytest.raises(TypeError, match="toy.x"):
        _derived("toy.x", list, rule())


def test_train_settings_are_read_from_the_keys_the_schema_checked():
    cfg = compose(["train.max_steps=7", "sample.top_k=null", "seed=3", "profile=true"])
    check_schema(cfg)
    s = train_settings(cfg)
    assert (s.max_steps, s.sample_top_k, s.seed, s.profile, s.data_seed) == (7, None, 3, True, 1337)
    assert (s.init_from, s.sample_tokens, s.sample_temperature, s.batch_size) == (None, 200, 0.8, 32)
    cfg = compose([])
    with open_dict(cfg):
        del cfg.train["init_from"]  # optional: absent reads as None (Hydra's ~ cannot delete a null value)
    check_schema(cfg)
    assert train_settings(cfg).init_from is None


@pytest.mark.parametrize(
    "group, key, near",
    [("model", "n_layers", "n_layer"), ("hardware", "thread", "threads"), ("sample", "topk", "top_k"),
     ("train", "max_step", "max_steps")],
)  # fmt: skip
def test_unknown_keys_of_a_settings_group_are_refused_by_name(group, key, near):
    hint = rf"\(did you mean {group}\.{near}\?\)"
    with pytest.raises(ConfigError, match=rf"^{group}\.{key}: not a {group} key {hint}; allowed: "):
        check_known_keys(group, {key: 1})
    check_known_keys(group, {"_target_": "x"})  # Hydra's own keys pass


def test_model_and_hardware_builders_refuse_unknown_keys_outside_training_too():
    """gptlab-flops and gptlab-decode build without validate(): the same one-line refusal."""
    with pytest.raises(ConfigError, match=r"^model.n_layers: not a model key"):
        model_config(compose(["+model.n_layers=2"]), vocab_size=None)
    with pytest.raises(ConfigError, match=r"^hardware.thread: not a hardware key"):
        build_hardware(compose(["+hardware.thread=2"]))


def test_check_schema_refuses_an_unknown_settings_key_before_any_value():
    with pytest.raises(
        ConfigError,
        match=r"^model.n_layers: not a model key \(did you mean model.n_layer\?\); allowed: bias, block_size",
    ):
        check_schema(compose(["+model.n_layers=2", "train.max_steps=-1"]))


def test_train_settings_refuse_a_missing_required_key_instead_of_reading_none():
    """A caller that skipped check_schema still gets no silent None for, e.g., train.max_steps."""
    cfg = compose([])
    with open_dict(cfg):
        del cfg.train["max_steps"]
    with pytest.raises(
        ConfigError,
        match=r"^train.max_steps: missing from the config \(removed with ~\?\); it is "
        r"required$",
    ):
        train_settings(cfg)


def test_the_schema_is_the_settings_fields_and_norm_placement_only():
    """No hand table: every key SCHEMA holds comes from a settings field or GPT's signature (the components' keys come
    from their own signatures when chosen)."""
    from_fields = {key: check for cls, group in SETTINGS for key, check in field_checks(cls, group).items()}
    assert param_checks(GPT.__init__, None) == {"norm.placement": PLACEMENT}  # only the parameter its rule keys
    assert SCHEMA == from_fields | {"norm.placement": PLACEMENT}


def test_norm_placement_is_one_rule_refused_alike_by_the_schema_and_the_model():
    line = "norm.placement: 'middle' is not allowed; allowed: pre, post"
    with pytest.raises(ConfigError) as schema:
        check_schema(compose(["norm.placement=middle"]))
    with pytest.raises(ConfigError) as built:  # gptlab-flops and decode build without validate(): GPT applies it
        build_model(compose(["norm.placement=middle", "model.n_layer=1"]), vocab_size=64, device="meta")
    assert str(schema.value) == str(built.value) == line


def _free(key: str, free) -> bool:
    return any(key.startswith(f) if f.endswith(".") else key == f for f in free)


@pytest.mark.parametrize(
    "overrides",
    [[], ["hardware=fsdp_cpu"], ["data=text"], ["data=hf"], ["data=assoc_recall", "optimizer=muon"],
     ["logger=[wandb,csv,tensorboard]", "probes=[recall,induction,length]", "optimizer=sgd", "schedule=wsd"]],
)  # fmt: skip
def test_the_keys_marked_curve_free_are_the_old_hand_list(overrides):
    cfg = compose(overrides)
    free = curve_free_keys(cfg)
    keys = set(flatten(plain_config(cfg))) | set(SCHEMA) | {f"{group}." for group in group_choices(cfg)}
    assert {k for k in keys if _free(k, free)} == {k for k in keys if _free(k, HAND_LIST)}
    assert {"logger.", "launcher."} <= set(free)  # their choices too, not only their keys


def test_a_components_marker_frees_its_key_where_the_chosen_target_takes_it():
    assert "data.num_proc" in curve_free_keys(compose([]))  # ShakespeareData's num_proc: rule(curve=False)
    assert "data.num_proc" not in curve_free_keys(compose(["data=assoc_recall"]))  # no such parameter there


def test_resume_refuses_what_the_marker_does_not_free():
    cfg = compose([])
    saved = {"config": plain_config(cfg), "choices": {}}
    changed = compose(["train.prefetch=0", "train.log_interval=7", "hardware.threads=3", "train.batch_size=4"])
    assert differences(saved, {"config": plain_config(changed), "choices": {}}, curve_free_keys(changed)) == [
        "train.batch_size=32 there, 4 here"
    ]
