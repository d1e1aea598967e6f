"""compose() keeps its results per process (gptlab/config/build.py): a repeated call is a copy of what a fresh
Hydra compose returns, and nothing it depends on (a conf/ file, the working directory, a search path) is ever
served stale."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from gptlab.config import build
from gptlab.config.build import compose

CONTRACT_CONF = Path(__file__).resolve().parent / "contract_conf"


def fresh(overrides: list[str], config_name: str = "train") -> DictConfig:
    """A compose with nothing kept from earlier calls (the memo emptied before and after)."""
    saved = dict(build._COMPOSED)
    build._COMPOSED.clear()
    try:
        return compose(overrides, config_name)
    finally:
        build._COMPOSED.clear()
        build._COMPOSED.update(saved)


def flags(node, path: str = "") -> dict[str, tuple]:
    """struct and readonly of every container node, by path (the copy must keep what Hydra set)."""
    out = {path: (OmegaConf.is_struct(node), OmegaConf.is_readonly(node), node._get_flag("allow_objects"))}
    if node._is_none() or node._is_missing() or node._is_interpolation():
        return out
    items = node.items_ex(resolve=False) if isinstance(node, DictConfig) else enumerate(node._iter_ex(resolve=False))
    for key, _ in items:
        child = node._get_node(key)
        if OmegaConf.is_config(child):
            out |= flags(child, f"{path}.{key}")
    return out


@pytest.mark.parametrize(
    ("overrides", "config_name"),
    [
        ([], "train"),
        (["attention=gqa", "mlp.ratio=3", "model.n_layer=2"], "train"),
        (["experiment=d12"], "train"),
        (["launcher=slurm", "logger=[wandb,csv]"], "train"),
        ([], "decode"),
    ],
)
def test_a_repeated_compose_is_a_fresh_composes_config_in_a_copy_of_its_own(overrides, config_name):
    first = compose(overrides, config_name)
    again = compose(overrides, config_name)
    assert any(k[:2] == (config_name, tuple(overrides)) for k in build._COMPOSED)  # kept: `again` was the copy
    reference = fresh(overrides, config_name)
    for cfg in (first, again):
        assert OmegaConf.to_container(cfg, resolve=False) == OmegaConf.to_container(reference, resolve=False)
        assert flags(cfg) == flags(reference)
    assert again is not first and again.hydra.runtime.choices == reference.hydra.runtime.choices
    first.model.n_layer = 99  # a caller changes its copy: no later caller sees it
    OmegaConf.update(again, "train.max_steps", 7, force_add=True)
    assert compose(overrides, config_name).model.n_layer == reference.model.n_layer
    assert compose(overrides, config_name).get("train", {}).get("max_steps") == reference.get("train", {}).get(
        "max_steps"
    )


def test_each_copy_resolves_its_own_run_dir():
    """The memo holds the config unresolved: two calls get two run dirs (${now:}, ${gptlab_uid:}), as two fresh
    composes do, never the first caller's resolved value."""
    dirs = {compose(["model.n_layer=3"]).hydra.run.dir for _ in range(3)}
    assert len(dirs) == 3


def test_an_edited_conf_file_composes_anew(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    shutil.copytree(build.CONF_DIR, conf)
    monkeypatch.setattr(build, "CONF_DIR", conf)
    tiny = conf / "model" / "tiny.yaml"
    text, shipped = tiny.read_text(), OmegaConf.load(tiny).n_layer
    assert compose([]).model.n_layer == shipped and 0 < shipped < 10
    for n_layer in (7, 9, shipped):  # the same size each time: a digest of the bytes, not the size or a coarse mtime
        tiny.write_text(text.replace(f"n_layer: {shipped}", f"n_layer: {n_layer}"))
        assert compose([]).model.n_layer == n_layer
    (conf / "model" / "wide.yaml").write_text(text)  # a new option is found
    assert compose(["model=wide"]).hydra.runtime.choices.model == "wide"
    (conf / "model" / "wide.yaml").unlink()
    with pytest.raises(Exception, match="Could not find 'model/wide'"):
        compose(["model=wide"])


def test_the_working_directory_is_part_of_the_key(tmp_path, monkeypatch):
    before = compose(["model.n_layer=5"]).hydra.runtime.cwd
    monkeypatch.chdir(tmp_path)
    assert compose(["model.n_layer=5"]).hydra.runtime.cwd == str(tmp_path) != before


def test_a_search_path_folder_is_read_as_conf_is(tmp_path):
    """hydra.searchpath's file:// folders are part of what a kept config was composed from: an edit there, a
    removed option, composes anew."""
    extra = tmp_path / "extra"
    shutil.copytree(CONTRACT_CONF, extra)
    overrides = [f"hydra.searchpath=[file://{extra}]", "attention=readme"]
    readme = extra / "attention" / "readme.yaml"
    assert compose(overrides).attention.impl == "sdpa"
    assert compose(overrides).hydra.searchpath == [f"file://{extra}"]
    assert any(k[1] == tuple(overrides) for k in build._COMPOSED)
    readme.write_text(readme.read_text().replace("impl: sdpa", "impl: flex"))  # same size
    assert compose(overrides).attention.impl == "flex"
    readme.unlink()
    with pytest.raises(Exception, match="Could not find 'attention/readme'"):
        compose(overrides)


@pytest.mark.filterwarnings("ignore:provider=hydra.searchpath in command-line")  # Hydra finds no ${oc.env:SUB}
@pytest.mark.parametrize(
    "entry",
    ["pkg://hydra.conf", "file://{big}", "file://small", "'file://{small}/${{oc.env:SUB}}'"],
    ids=["pkg", "over-1000-files", "relative", "interpolation"],
)
def test_a_search_path_it_cannot_pin_down_is_never_kept(entry, tmp_path, monkeypatch):
    """A pkg:// entry (no folder to read), a folder of more than 1,000 files (a search path on a whole project), a
    relative folder and one named by an interpolation compose every time."""
    big, small = tmp_path / "big", tmp_path / "small"
    (small / "sub").mkdir(parents=True)
    (small / "sub" / "extra.yaml").write_text("x: 1\n")
    big.mkdir()
    for i in range(1001):
        (big / f"{i}.txt").touch()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SUB", "sub")
    overrides = [f"hydra.searchpath=[{entry.format(big=big, small=small)}]", "model.n_layer=3"]
    compose(overrides)
    compose(overrides)
    assert not any(k[1] == tuple(overrides) for k in build._COMPOSED)


def test_the_memo_keeps_the_newest_calls_only(monkeypatch):
    monkeypatch.setattr(build, "_COMPOSED_MAX", 2)
    monkeypatch.setattr(build, "_COMPOSED", type(build._COMPOSED)())
    for n in (1, 2, 1, 3):  # 1 used again after 2: 2 is the oldest when 3 arrives
        compose([f"model.n_layer={n}"])
    assert [k[1] for k in build._COMPOSED] == [("model.n_layer=1",), ("model.n_layer=3",)]
