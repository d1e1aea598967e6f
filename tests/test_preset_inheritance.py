"""Presets that inherit (`defaults: [base, _self_]` inside a group) state only what differs from their base, and
compose to exactly the base plus those keys; the help page names the base."""

from __future__ import annotations

import pytest
import yaml
from omegaconf import OmegaConf

from gptlab.cli.help import group_page, read_yaml_doc
from gptlab.config.build import compose
from gptlab.util.paths import CONF_DIR

INHERITING = sorted(
    (p.parent.name, p.stem, read_yaml_doc(p).base)
    for p in CONF_DIR.glob("*/*.yaml")
    if p.parent.name != "hydra" and read_yaml_doc(p).base and read_yaml_doc(p).package != "_global_"
)  # experiment=* (`# @package _global_`) inherit d12 too, over several groups: tests/test_experiments.py


def node(group: str, option: str) -> dict:
    """The group's node of the config composed with this option (resolve=False: interpolations as written)."""
    return OmegaConf.to_container(compose([f"{group}={option}"])[group], resolve=False)


def own_keys(group: str, option: str) -> dict:
    doc = yaml.safe_load((CONF_DIR / group / f"{option}.yaml").read_text())
    return {k: v for k, v in doc.items() if k != "defaults"}


def test_the_attention_hardware_and_gpt2_size_presets_inherit():
    assert {(g, o) for g, o, _ in INHERITING} >= {
        ("attention", "gqa"),
        ("attention", "mqa"),
        ("attention", "sliding"),
        ("attention", "hybrid"),
        ("hardware", "cuda"),
        ("hardware", "ddp"),
        ("hardware", "fsdp"),
        ("hardware", "ddp_cpu"),
        ("hardware", "fsdp_cpu"),
        ("hardware", "auto"),
        ("model", "gpt2-medium"),
        ("model", "gpt2-large"),
        ("model", "gpt2-xl"),
    }


@pytest.mark.parametrize("group,option,base", INHERITING, ids=[f"{g}={o}" for g, o, _ in INHERITING])
def test_a_preset_states_only_what_differs_and_composes_to_base_plus_it(group, option, base):
    assert (CONF_DIR / group / f"{base}.yaml").is_file(), f"{group}/{option}.yaml inherits a missing {base}"
    parent, mine = node(group, base), own_keys(group, option)
    same = sorted(k for k, v in mine.items() if k in parent and parent[k] == v)
    assert not same, f"{group}/{option}.yaml repeats {base}'s value for {same}"
    assert node(group, option) == {**parent, **mine}


def test_the_help_page_names_the_base():
    page = group_page("attention").splitlines()
    gqa = page[page.index("gqa") :]
    assert gqa[2] == "    (the keys of mha, changed as below)"
    assert gqa[3].strip().startswith("attention.n_kv_head=4")
