"""A run's stored files are checked on every read: tokenizer.json against the sha256 the run recorded when it started
(provenance.json), and .hydra/config.yaml as a YAML mapping; anything else is one line naming the file and the fix.

Before, a tokenizer.json swapped in from another run was used by the readers that had no checkpoint fingerprint to
compare (gptlab-flops RUN_DIR, the timing session), one edited with its own hash redone was used by all of them, and
a config.yaml that was not YAML was a traceback.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from gptlab.cli import sample as sample_cli
from gptlab.config.build import compose
from gptlab.config.costing import run_dir_config
from gptlab.config.trained import load_trained
from gptlab.data.tokenizer_file import spec_sha256
from gptlab.data.tokenizers import CharTokenizer
from gptlab.errors import ConfigError
from gptlab.state.rundir import run_config
from helpers.train import FAST, run_inprocess

TEXT = "the quick brown fox jumps over the lazy dog\n" * 300
OTHER = "pack my box with five dozen liquor jugs!\n" * 300


def _snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def _train(tmp: Path, name: str, text: str) -> Path:
    """A 2-step char run on `text`, with the .hydra/config.yaml Hydra would have saved."""
    corpus, run = tmp / f"{name}.txt", tmp / name
    corpus.write_text(text)
    args = [
        "data=text",
        f"data.paths=[{corpus}]",
        "data.tokenizer=char",
        "schedule=constant",
        "schedule.warmup_steps=0",
    ]
    run_inprocess(run, *args, steps=2, eval_interval=2)
    (run / ".hydra").mkdir(exist_ok=True)
    OmegaConf.save(compose([*FAST, "train.max_steps=2", "train.eval_interval=2", *args]), run / ".hydra/config.yaml")
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("stored")
    return _train(tmp, "run", TEXT), _train(tmp, "other", OTHER)


def _readers(run: Path) -> list:
    """Every way a run's tokenizer is read back: sample/decode/export/eval (load_trained) and gptlab-flops RUN_DIR."""
    return [lambda: load_trained(run), lambda: run_dir_config(run, [])]


def test_the_run_records_its_tokenizers_sha256_when_it_starts(runs):
    run, _ = runs
    recorded = json.loads((run / "provenance.json").read_text())["tokenizer_sha256"]
    assert recorded == json.loads((run / "tokenizer.json").read_text())["sha256"]
    assert load_trained(run)[1].tokenizer.vocab_size == run_dir_config(run, [])[1]


def test_another_runs_tokenizer_is_refused_by_every_reader(runs, tmp_path):
    run, other = runs
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    shutil.copyfile(other / "tokenizer.json", copy / "tokenizer.json")  # itself intact, another run's
    for read in _readers(copy):
        with pytest.raises(
            ConfigError, match=r"tokenizer\.json: .*(not the tokenizer the run trained with|another run)"
        ):
            read()


def test_an_edited_tokenizer_with_its_hash_redone_is_refused_by_every_reader(runs, tmp_path, capsys):
    run, _ = runs
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    doc = json.loads((copy / "tokenizer.json").read_text())
    doc["tokenizer"]["chars"] = doc["tokenizer"]["chars"].replace(
        "a", "A"
    )  # same size, another mapping, its identity and hash redone
    doc["tokenizer"]["identity"] = CharTokenizer(doc["tokenizer"]["chars"]).identity()
    doc["sha256"] = spec_sha256(doc["tokenizer"])
    (copy / "tokenizer.json").write_text(json.dumps(doc))
    for read in _readers(copy):
        with pytest.raises(ConfigError, match=r"tokenizer\.json: sha256 \w+, but the run recorded \w+ when it started"):
            read()
    before = _snapshot(copy)
    with pytest.raises(SystemExit) as done:
        sample_cli.main([str(copy), "--prompt", "the", "--tokens", "2"])
    err = capsys.readouterr().err.strip()
    assert done.value.code == 2 and err.startswith(f"error: {copy / 'tokenizer.json'}: sha256") and "\n" not in err
    assert _snapshot(copy) == before


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200) | st.sampled_from(["a: [1, 2", "key: value\n  bad: indent", "- 1\n- 2", "42", ""]))
def test_a_saved_config_that_is_not_a_yaml_mapping_is_one_line(tmp_path, text):
    """Whatever config.yaml holds: a config, or one ConfigError line naming the file and how to restore it."""
    (tmp_path / ".hydra").mkdir(exist_ok=True)
    saved = tmp_path / ".hydra" / "config.yaml"
    saved.write_text(text, encoding="utf-8")
    try:
        cfg = run_config(tmp_path)
    except ConfigError as err:
        assert str(err).startswith(f"{saved}: ") and "\n" not in str(err)
        assert "restore it from a copy of the run" in str(err)
    else:
        assert OmegaConf.is_dict(cfg)


def test_sample_on_a_damaged_saved_config_is_one_line(runs, tmp_path, capsys):
    run, _ = runs
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / ".hydra" / "config.yaml").write_text("model: {d_model: 64\ntrain: [")
    with pytest.raises(SystemExit) as done:
        sample_cli.main([str(copy), "--prompt", "the"])
    err = capsys.readouterr().err.strip()
    assert done.value.code == 2 and "\n" not in err
    assert err.startswith(f"error: {copy / '.hydra' / 'config.yaml'}: not valid YAML")
