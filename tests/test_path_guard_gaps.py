"""The gaps of the one path guard (gptlab/state/layout.py), each a one-line refusal before anything is written:

- a symlink loop, or a path of PATH_MAX bytes or more, was a traceback (an OSError at the first stat or mkdir);
- a sweep --out holding '${' reached Hydra as an interpolation; an --out that is an existing file failed late;
- GPTLAB_CACHE inside a run dir filled that run's dir with a token cache;
- a folder of the user's own files that happens to hold `checkpoints/` was taken for a run dir and trained into;
- an output name the file system allows but whose temp name ('.<name>.<pid>.tmp') it does not failed after the work
  (gptlab-decode out= measured, then could not write).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptlab.cli.export import _check_out as export_out
from gptlab.compare import modes
from gptlab.errors import ConfigError
from gptlab.state.layout import LOCK_FILE, check_output, check_run_dir, check_run_path
from gptlab.sweep.launch import check_paths
from gptlab.util.io import atomic_write_text
from helpers.cli import run_cli
from helpers.train import TINY, run_inprocess, train_env

PROPERTY = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TAILS = st.lists(st.sampled_from(["a", "b", "out", "x y", "é"]), max_size=3).map("/".join)


def snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


def fake_run(path: Path) -> Path:
    (path / "checkpoints").mkdir(parents=True)
    (path / "checkpoints" / "step_2.pt").write_bytes(b"weights")
    (path / ".hydra").mkdir()
    (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"seed": 0}))
    for name, text in (("provenance.json", "{}\n"), ("summary.json", '{"status": "finished"}\n'), (LOCK_FILE, "")):
        (path / name).write_text(text)
    return path


def guards(base: Path) -> dict:
    """Every writer's guard as a call on a path (the library calls the CLIs make)."""
    mine = fake_run(base / "mine") if not (base / "mine").exists() else base / "mine"
    return {
        "train/decode run dir": check_run_path,
        "decode out= / speculative --out / eval.json": lambda p: check_output(p, "out", own=[mine]),
        "export --out": lambda p: export_out(Path(p), mine),
        "compare --out": lambda p: modes.out_dir(p, str(mine), [mine]),
        "sweep --out": lambda p: check_paths(Path(p), ["a"], [0]),
    }


def refused(call, path) -> str:
    with pytest.raises(ConfigError) as err:
        call(path)
    assert "\n" not in str(err.value) and str(err.value)
    return str(err.value)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("gaps")
    (base / "loop_a").symlink_to(base / "loop_b")
    (base / "loop_b").symlink_to(base / "loop_a")
    (base / "self").symlink_to(base / "self")
    (base / "plain").mkdir()
    (base / "to_loop").symlink_to(base / "loop_a")
    return base


@PROPERTY
@given(start=st.sampled_from(["loop_a", "loop_b", "self", "to_loop", "plain/../loop_a"]), tail=TAILS)
def test_a_symlink_loop_is_one_line_for_every_writer(world, start, tail):
    before = snapshot(world / "plain")
    path = f"{world}/{start}/{tail}".rstrip("/")
    for name, call in guards(world).items():
        assert "symlink loop" in refused(call, path), name
    assert snapshot(world / "plain") == before


@PROPERTY
@given(depth=st.integers(1, 3), name=st.sampled_from(["x", "é", "long_" * 40]), extra=st.integers(0, 300))
def test_a_path_of_path_max_bytes_or_more_is_one_line_for_every_writer(world, depth, name, extra):
    parts = [name] * ((4096 + extra) // len(os.fsencode(name + "/")) + 1)
    path = str(world / "plain" / "/".join(parts))
    for label, call in guards(world).items():
        assert "bytes in a path" in refused(call, path), label
    assert not any((world / "plain").iterdir())


@PROPERTY
@given(head=st.text("ab-_ é", max_size=8), tail=st.text("ab}{:._ ", max_size=12))
def test_a_sweep_out_holding_an_interpolation_is_refused(tmp_path, head, tail):
    out = tmp_path / f"{head}${{{tail}"
    message = refused(lambda p: check_paths(Path(p), ["a"], [0]), str(out))
    assert message.startswith("--out=") and "'${'" in message
    assert not any(tmp_path.iterdir())


def test_an_out_that_is_an_existing_file_is_refused_before_anything_is_written(world, tmp_path):
    mine = world / "mine" if (world / "mine").exists() else fake_run(world / "mine")
    target = tmp_path / "report.txt"
    target.write_text("the user's own file\n")
    for call in (
        lambda p: check_paths(Path(p), ["a"], [0]),
        lambda p: export_out(Path(p), mine),
        lambda p: modes.out_dir(p, str(mine), [mine]),
        lambda p: check_output(f"{p}/decode.json", "out", own=[mine]),
    ):
        assert "is a file, not a folder" in refused(call, str(target))
    assert target.read_text() == "the user's own file\n" and sorted(os.listdir(tmp_path)) == ["report.txt"]


def test_a_cache_inside_a_run_dir_is_refused_before_any_token_is_written(tmp_path, monkeypatch):
    victim = fake_run(tmp_path / "victim")
    before = snapshot(victim)
    monkeypatch.setenv("GPTLAB_CACHE", str(victim / "cache"))
    run = tmp_path / "run"
    with pytest.raises(ConfigError, match=rf"^GPTLAB_CACHE={victim}/cache: lies inside the run dir {victim}; allowed"):
        run_inprocess(run, *TINY, steps=1, eval_interval=1)
    assert snapshot(victim) == before


def test_a_user_folder_holding_checkpoints_is_not_taken_for_a_run(tmp_path):
    folder = tmp_path / "mine"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "model.bin").write_bytes(b"the user's weights")
    (folder / "notes.txt").write_text("my notes\n")
    before = snapshot(folder)
    with pytest.raises(ConfigError, match=r"holds files that are not a gptlab run \(checkpoints, notes\.txt\)"):
        check_run_dir(folder)
    done = run_cli("gptlab.cli.train", f"hydra.run.dir={folder}", *TINY, "train.max_steps=1", env=train_env())
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "not a gptlab run" in lines[0], done.stderr[-2000:]
    assert snapshot(folder) == before
    check_run_dir(fake_run(tmp_path / "run"))  # a real run dir (lock, provenance) is still resumable


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.sampled_from("aé漢- _"), min_size=1, max_size=8), size=st.integers(1, 255))
def test_any_name_the_guard_accepts_is_written(tmp_path, text, size):
    """The guard allows names up to 255 bytes; the atomic write's temp name must fit too, or the write fails after
    the work that produced it."""
    name = os.fsencode("a" + text * 255)[:size].decode("utf-8", "ignore").rstrip() or "a"
    path = check_output(tmp_path / "out" / name, "out")
    path.parent.mkdir(exist_ok=True)
    atomic_write_text(path, "{}\n")
    assert path.read_text() == "{}\n" and os.listdir(path.parent) == [name]
    path.unlink()
