"""The run schema (gptlab/config/schema.py): it covers every key the shipped configs have, each check's message is
exact, every shipped choice passes it, and hardware.compile maps onto torch.compile's modes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated
from unittest import mock

import pytest
import torch
import yaml

from gptlab.config.build import compose
from gptlab.config.schema import (
    COMPONENT_GROUPS,
    REQUIRED,
    SCHEMA,
    SEED,
    SELECTED_GROUPS,
    check_schema,
    param_checks,
    signature_checks,
)
from gptlab.errors import ConfigError
from gptlab.runtime.hardware import COMPILE_MODES, Hardware, compile_mode
from gptlab.util.checks import Auto, Bool, Number, OneOf, Seq, Text, rule, show

CONF = Path(__file__).resolve().parents[1] / "conf"
GLOBAL_PACKAGES = {"launcher", "tune"}  # `# @package _global_`: Hydra/launcher settings, no run keys
CHECKED_ELSEWHERE = {"logger.wandb.mode": "gptlab.sinks.wandb.resolve_mode"}


def shipped_keys() -> set[str]:
    """Every dotted key the shipped YAML files define (group files and the run-level keys of train.yaml)."""
    keys = set()
    for path in CONF.glob("*/*.yaml"):
        text = path.read_text()
        package = text.split("\n", 1)[0].removeprefix("# @package ").strip() if text.startswith("# @package") else None
        if path.parent.name not in GLOBAL_PACKAGES and package != "_global_":
            prefix = package or path.parent.name  # logger options: `# @package logger.<name>`
            own = yaml.safe_load(text) or {}  # `defaults` (a preset's base) is Hydra's list, not a key
            keys |= {f"{prefix}.{k}" for k in own if not k.startswith("_") and k != "defaults"}
    root = yaml.safe_load((CONF / "train.yaml").read_text())
    for key, value in root.items():
        if key in ("defaults", "hydra"):
            continue
        keys |= {f"{key}.{k}" for k in value} if isinstance(value, dict) else {key}
    return keys


def declared_keys() -> set[str]:
    """The component keys whose check the chosen class or factory declares in its signature (a rule, or the type)."""
    keys = set()
    for group in COMPONENT_GROUPS:
        for path in CONF.glob(f"{group}/*.yaml"):
            target = (yaml.safe_load(path.read_text()) or {}).get("_target_")
            keys |= set(signature_checks(group, target)) if target else set()
    for group in SELECTED_GROUPS:  # `# @package <group>.<name>`: each logger's and probe's keys, from its signature
        for path in CONF.glob(f"{group}/*.yaml"):
            target = (yaml.safe_load(path.read_text()) or {}).get("_target_")
            keys |= set(signature_checks(f"{group}.{path.stem}", target)) if target else set()
    return keys


def test_every_shipped_key_has_a_check_and_every_check_a_key():
    keys = shipped_keys()
    assert sorted(keys - set(SCHEMA) - declared_keys() - set(CHECKED_ELSEWHERE)) == []
    assert sorted(set(SCHEMA) - keys) == []
    assert set(REQUIRED) <= set(SCHEMA)


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
def test_every_shipped_choice_passes_the_schema():
    overrides = [[]] + [
        [f"{p.parent.name}={p.stem}"] for p in sorted(CONF.glob("*/*.yaml")) if p.parent.name not in GLOBAL_PACKAGES
    ]
    for override in overrides:
        check_schema(compose(override))  # raises on the first refusal


@pytest.mark.parametrize(
    "check, value, message",
    [
        (Number(">= 1", int), -5, "k=-5: must be >= 1"),
        (Number(">= 1", int), 1.5, "k=1.5: expected an integer >= 1"),
        (Number(">= 1", int), "abc", "k='abc': expected an integer >= 1"),
        (Number(">= 1", int), True, "k=true: expected an integer >= 1"),
        (Number(">= 1", int, null=True), 0, "k=0: must be >= 1 or null"),
        (Number("> 0"), -1, "k=-1: must be > 0"),
        (Number("> 0"), 0.0, "k=0.0: must be > 0"),
        (Number("> 0"), float("nan"), "k=nan: must be a finite number > 0"),
        (Number("> 0"), 10**400, f"k={10**400}: must be a finite number > 0"),
        (Number("[0, 1)"), 1, "k=1: must be in [0, 1)"),
        (Number("[0, 1)"), "abc", "k='abc': expected a number in [0, 1)"),
        (Number("(0, 1]"), 0, "k=0: must be in (0, 1]"),
        (Number("[0, 1]"), -3, "k=-3: must be in [0, 1]"),
        (Number(">= 0", note="0 = greedy"), -1, "k=-1: must be >= 0 (0 = greedy)"),
        (SEED, 2**63, f"k={2**63}: must be in [0, 2**63)"),
        (SEED, -1, "k=-1: must be in [0, 2**63)"),
        (Bool(), "false", "k='false': expected true or false (unquoted)"),
        (Bool(), 1, "k=1: expected true or false"),
        (Bool(null=True), "auto", "k='auto': expected true or false or null"),
        (
            OneOf(COMPILE_MODES),
            "false",
            "k: 'false' is not allowed; allowed: false, true, default, reduce-overhead, "
            "max-autotune (true/false unquoted)",
        ),
        (OneOf(COMPILE_MODES), 2, "k: 2 is not allowed; allowed: false, true, default, reduce-overhead, max-autotune"),
        (OneOf(COMPILE_MODES), 1, "k: 1 is not allowed; allowed: false, true, default, reduce-overhead, max-autotune"),
        (OneOf(("pre", "post")), "middle", "k: 'middle' is not allowed; allowed: pre, post"),
        (Text(), 3, "k=3: expected a string"),
        (Text(many=True), ["a", 1], "k=['a', 1]: expected a string or a list of strings"),
        (Auto(Number("> 0")), "abc", "k='abc': expected 'auto' or a number > 0"),
        (Auto(Number("> 0")), 0, "k=0: must be > 0"),
        (Seq(Number("[0, 1)"), length=2), "abc", "k='abc': expected a list of 2 numbers, each in [0, 1)"),
        (Seq(Number("[0, 1)"), length=2), [0.9], "k=[0.9]: expected a list of 2 numbers, each in [0, 1)"),
        (Seq(Number("[0, 1)"), length=2), [0.9, 1.0], "k[1]=1.0: must be in [0, 1)"),
        (Seq(Number(">= 0", int), null=True), [1, -1], "k[1]=-1: must be >= 0"),
        (Number("", int), "abc", "k='abc': expected an integer"),  # any integer: an un-annotated `int` parameter
        (Number("", int), 1.5, "k=1.5: expected an integer"),
        (Number("", int, null=True), True, "k=true: expected an integer or null"),
        (Number(""), float("inf"), "k=inf: must be a finite number"),
    ],
)
def test_refusal_messages(check, value, message):
    with pytest.raises(ConfigError) as err:
        check("k", value)
    assert str(err.value) == message


@pytest.mark.parametrize(
    "check, value",
    [
        (Number(">= 1", int), 1),
        (Number("> 0"), 1e-12),
        (Number("> 0"), 3),
        (Number("[0, 1)"), 0),
        (Number("(0, 1]"), 1),
        (Number("[0, 1]"), 1.0),
        (Number(">= 1", int, null=True), None),
        (SEED, 2**63 - 1),
        (Bool(), False),
        (Bool(null=True), None),
        (OneOf(COMPILE_MODES), True),
        (OneOf(COMPILE_MODES), "max-autotune"),
        (Text(null=True, numbers=True), 12),
        (Text(many=True), ["a.txt"]),
        (Text(many=True), "a.txt"),
        (Auto(Number("> 0")), "auto"),
        (Auto(Number("> 0")), 1e12),
        (Seq(Number("[0, 1)"), length=2), [0.9, 0.95]),
        (Seq(Number(">= 0", int), null=True), None),
        (Number("", int), -(2**70)),
        (Number(""), -1e300),
        (Number("", int, null=True), None),
    ],
)
def test_accepted_values(check, value):
    check("k", value)


def _plain(
    model,
    ratio: float = 4,
    width: int = 64,
    gated: bool = True,
    act: str = "gelu",
    cap: int | None = None,
    layers: list[int] | None = None,
    path: Path | None = None,
    eps: Annotated[float, rule("> 0")] = 1e-5,
    every: Annotated[int | None, rule(">= 1", curve=False)] = None,
):
    """A factory written like swiglu.py before its rules: plain annotations, one key with a rule."""


def test_a_parameter_without_a_rule_is_checked_by_its_type():
    assert param_checks(_plain, "mlp") == {
        "mlp.ratio": Number(""),
        "mlp.width": Number("", int),
        "mlp.gated": Bool(),
        "mlp.act": Text(),
        "mlp.cap": Number("", int, null=True),
        "mlp.eps": Number("> 0"),
        "mlp.every": Number(">= 1", int, null=True),
    }  # model (no annotation), a list and a path: run-time arguments or keys that name their check in a rule
    with pytest.raises(TypeError, match=r"^mlp.x: give the parameter rule\(check=...\)"):

        def listed(x: Annotated[list, rule()] = ()):
            """A rule that cannot be derived from its type is a mistake, not an unchecked key."""

        param_checks(listed, "mlp")


def test_show_spells_values_as_the_config_does():
    assert [show(v) for v in (None, True, "x", [1, None], 1.5)] == ["null", "true", "'x'", "[1, null]", "1.5"]


def test_seed_range_is_what_torch_accepts():
    torch.manual_seed(2**63 - 1)  # the largest seed the schema allows
    torch.Generator().manual_seed(2**63 - 1)
    with pytest.raises((RuntimeError, ValueError)):
        torch.manual_seed(2**64)  # torch's own limit lies beyond the schema's


def test_missing_required_key_and_choice_specific_keys():
    cfg = compose(["~seed"])
    with pytest.raises(ConfigError, match=r"^seed: missing from the config \(removed with ~\?\); it is required$"):
        check_schema(cfg)
    check_schema(compose(["optimizer=sgd"]))  # no betas/eps in sgd: not required
    with pytest.raises(ConfigError, match=r"^optimizer.momentum=1: must be in \[0, 1\)$"):
        check_schema(compose(["optimizer=sgd", "optimizer.momentum=1"]))


def test_interpolations_are_resolved_before_checking():
    cfg = compose(["hardware=ddp", "hardware.tasks_per_node=0"])  # gpus_per_node: ${.tasks_per_node}
    with pytest.raises(ConfigError, match=r"^hardware.tasks_per_node=0: must be >= 1$"):
        check_schema(cfg)


@pytest.mark.parametrize(
    "value, mode",
    [
        (False, None),
        (True, "default"),
        ("default", "default"),
        ("reduce-overhead", "reduce-overhead"),
        ("max-autotune", "max-autotune"),
    ],
)
def test_compile_mode(value, mode):
    """Compiled in place with model.compile(mode=...) (state-dict keys unprefixed); CUDA graphs need a CUDA device."""
    assert compile_mode(value) == mode
    if mode == "reduce-overhead":
        with pytest.raises(ConfigError, match="reduce-overhead"):
            Hardware(device="cpu", dtype="fp32", compile=value)
        return
    model = torch.nn.Linear(2, 2)
    with mock.patch.object(torch.nn.Linear, "compile") as compiled:
        out = Hardware(device="cpu", dtype="fp32", compile=value).compiled(model)
    assert out is model
    assert compiled.call_args_list == ([] if mode is None else [mock.call(mode=mode)])


@pytest.mark.parametrize("value", ["false", "yes", 2, 1, 0, None, "Default"])
def test_compile_mode_refuses_everything_else(value):
    with pytest.raises(
        ConfigError,
        match=r"^hardware.compile: .* is not allowed; allowed: false, true, default, "
        r"reduce-overhead, max-autotune$",
    ):
        compile_mode(value)
    with pytest.raises(ConfigError):
        Hardware(device="cpu", dtype="fp32", compile=value)
