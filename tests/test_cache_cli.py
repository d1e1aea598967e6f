"""gptlab-cache: list what the cache holds (corpus, tokenizer, tokens, size, last use), remove one entry, prune by age."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from gptlab.config.build import build_data, compose
from gptlab.data import default_cache_dir
from helpers.cli import run_cli


@pytest.fixture
def cache_with_entries(tmp_path, monkeypatch):
    """Two token caches (char and byte tokenizers over one small corpus) in a cache of this test's own (the
    session's hermetic cache holds other tests' entries)."""
    monkeypatch.setenv("GPTLAB_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 300)
    for tokenizer in ("char", "byte"):
        build_data(compose(["data=text", f"data.paths=[{corpus}]", f"data.tokenizer={tokenizer}"]), 32)
    return default_cache_dir()


def listed(cache) -> list[list[str]]:
    done = run_cli("gptlab.cli.cache", "list")
    assert done.returncode == 0, done.stderr
    return [line.split() for line in done.stdout.splitlines()[1:-1]]


def test_list_shows_each_token_cache_with_its_tokenizer_and_tokens(cache_with_entries):
    rows = [r for r in listed(cache_with_entries) if r[1] == "tokens"]
    assert sorted(r[2] for r in rows) == ["byte", "char"]
    assert {r[3] for r in rows} == {f"{44 * 300:,}"}  # one token per character / byte of the ASCII corpus


def test_rm_by_prefix_and_prune_by_age(cache_with_entries):
    tokens = sorted(p for p in (cache_with_entries / "tokens").iterdir() if p.is_dir())
    assert len(tokens) == 2
    done = run_cli("gptlab.cli.cache", "rm", tokens[0].name[:8])
    assert done.returncode == 0 and not tokens[0].exists() and tokens[1].exists()
    old = time.time() - 40 * 86400
    for path in [tokens[1], *tokens[1].iterdir()]:
        os.utime(path, (old, old))  # last used 40 days ago
    dry = run_cli("gptlab.cli.cache", "prune", "--older-than", "30d", "--dry-run")
    assert "would remove 1 entries" in dry.stdout and tokens[1].exists()
    assert run_cli("gptlab.cli.cache", "prune", "--older-than", "30d").returncode == 0
    assert not tokens[1].exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["prune", "--older-than", "soon"], "--older-than 'soon': allowed: a number and a unit s, m, h or d"),
        (["rm", "abc"], "'abc': give at least 6 characters of a key"),
        (["rm", "ffffffffff"], "'ffffffffff' matches 0 cache entries"),
    ],
)
def test_bad_input_is_one_line(args, message):
    done = run_cli("gptlab.cli.cache", *args)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and message in lines[0]


def test_a_killed_runs_hf_scratch_is_listed_and_pruned_but_a_live_ones_is_kept(tmp_path, monkeypatch):
    """hf-scratch/<pid>-<hash>: the Arrow copy a data=hf run makes of a local folder; one whose process is gone is
    an entry like any other, one whose process runs is never removed."""
    monkeypatch.setenv("GPTLAB_CACHE", str(tmp_path / "cache"))
    dead = _finished_pid()
    scratch = tmp_path / "cache" / "hf-scratch"
    gone, live = scratch / f"{dead}-abcdef012345", scratch / f"{os.getpid()}-abcdef012345"
    for folder in (gone, live):
        folder.mkdir(parents=True)
        (folder / "data.arrow").write_bytes(b"x" * 1000)
        old = time.time() - 40 * 86400
        os.utime(folder, (old, old))
    rows = [r for r in listed(tmp_path / "cache") if r[1] == "scratch"]
    assert len(rows) == 2
    assert run_cli("gptlab.cli.cache", "prune", "--older-than", "30d").returncode == 0
    assert not gone.exists() and live.exists()


def _finished_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_cache_path_that_is_a_file_is_refused_in_one_line_by_every_reader(tmp_path, monkeypatch):
    """GPTLAB_CACHE pointing at a file listed as an empty cache ("0 entries") and failed at the first write."""
    from gptlab.compare.statistics.noise_floor import cache_dir
    from gptlab.errors import ConfigError

    file = tmp_path / "not-a-folder"
    file.write_text("x")
    monkeypatch.setenv("GPTLAB_CACHE", str(file))
    done = run_cli("gptlab.cli.cache", "list")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and done.stdout == ""
    assert lines[0].endswith(f"GPTLAB_CACHE={file} is not a folder; point it at a folder (created when missing)")
    for reader in (default_cache_dir, cache_dir):  # the data cache and the noise-floor store
        with pytest.raises(ConfigError, match="is not a folder"):
            reader()
    monkeypatch.setenv("GPTLAB_CACHE", str(tmp_path / "new"))
    assert default_cache_dir() == cache_dir() == tmp_path / "new"  # a missing folder is fine: created on first write


def test_the_stored_noise_floors_are_listed_and_help_is_whole(tmp_path, monkeypatch):
    """gptlab-cache list left out the noise floors gptlab-sweep --aa stores, and --help stopped mid-sentence."""
    from gptlab.compare.statistics.noise_floor import FLOOR_FILE

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / FLOOR_FILE).write_text("{}")
    monkeypatch.setenv("GPTLAB_CACHE", str(cache))
    done = run_cli("gptlab.cli.cache", "list")
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    assert any(row[:2] == [FLOOR_FILE[:14], "floors"] for row in rows), done.stdout  # keys show 14 characters
    page = run_cli("gptlab.cli.cache", "--help").stdout
    assert "cache ($GPTLAB_CACHE, else ~/.cache/gptlab), and removing it." in " ".join(page.split())
