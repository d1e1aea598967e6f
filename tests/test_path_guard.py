"""No spelling of a path gets a write into another run (issue 44, class 3 and the path part of class 5).

Every writing CLI asks gptlab/state/layout.py's one guard, which resolves the path (symlinks, '..', '.', trailing
separators) before any check: gptlab-train's and gptlab-decode's run dir (check_run_path, before Hydra writes
.hydra/ and train.log), gptlab-compare's --out in every mode (compare/modes.py out_dir), gptlab-export's --out
(checkpoint and Hugging Face), gptlab-decode's out=, gptlab-speculative's --out, gptlab-eval's eval.json and
gptlab-sweep's --out (check_paths), whose runs' dirs and generated configs must also fit the file system's 255-byte
names. The property tests call those library guards in-process over many spellings; one real CLI per writer checks
the exit code, the one-line message and that the other run's files stay byte-identical.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptlab.cli.export import _check_out as export_out
from gptlab.compare import modes
from gptlab.errors import ConfigError
from gptlab.interop.export import _check_out as hf_export_out
from gptlab.state.layout import LOCK_FILE, NAME_MAX, check_output, check_run_path
from gptlab.sweep.launch import check_paths
from gptlab.sweep.plan import PlannedRun, launch_command, plain_command, single_command
from helpers.cli import run_cli
from helpers.compare import write_sweep

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
NAMES = st.text(st.sampled_from("ab é漢-_. "), min_size=1, max_size=12).filter(
    lambda n: n.strip(" ") == n and n not in (".", "..") and not n.startswith(".")
)  # spaces and non-ASCII; no hidden names (a run's own .hydra is tried on its own)
TAILS = st.one_of(
    st.sampled_from(["", "checkpoints", "checkpoints/step_9.pt", ".hydra", ".hydra/x", LOCK_FILE, "summary.json"]),
    st.lists(NAMES, min_size=1, max_size=3).map("/".join),
)
ROUTES = ("direct", "dotdot", "dot", "symlink")


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under folder -> the sha256 of a file's bytes ('dir' for a folder): what nothing may change."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


def fake_run(path: Path) -> Path:
    """A finished run dir as the guards see one: lock, provenance, checkpoints, saved config, summary."""
    (path / "checkpoints").mkdir(parents=True)
    (path / "checkpoints" / "step_2.pt").write_bytes(b"weights")
    (path / ".hydra").mkdir()
    (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"seed": 0}))
    for name, text in (("provenance.json", "{}\n"), ("summary.json", '{"status": "finished"}\n'), (LOCK_FILE, "")):
        (path / name).write_text(text)
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """victim/ (another run), mine/ (the run a command reads), plain/ (a folder of no run), d/ (empty) and symlinks
    to_victim -> victim, to_plain -> plain, to_mine -> mine."""
    base = tmp_path_factory.mktemp("world")
    fake_run(base / "victim")
    fake_run(base / "mine")
    (base / "plain").mkdir()
    (base / "d").mkdir()
    (base / "to_victim").symlink_to(base / "victim")
    (base / "to_plain").symlink_to(base / "plain")
    (base / "to_mine").symlink_to(base / "mine")
    return base


def spelled(base: Path, where: str, tail: str, route: str, trailing: bool) -> str:
    """base/where/tail spelled another way: through '..' past a folder that does not exist, through '.', through a
    symlink, with a trailing separator."""
    if route == "dotdot":
        text = f"{base}/d/zz/../../{where}/{tail}"
    elif route == "dot":
        text = f"{base}/./{where}/./{tail}"
    elif route == "symlink":
        text = f"{base}/to_{where}/{tail}"
    else:
        text = f"{base}/{where}/{tail}"
    text = text.rstrip("/") if tail == "" else text
    return text + "/" if trailing else text


def writers(base: Path) -> dict:
    """Every writer's guard as a call on the spelled path (the library calls the CLIs make)."""
    mine = base / "mine"
    return {
        "compare --out (every mode)": lambda p: modes.out_dir(p, str(mine), [mine]),
        "decode out= / speculative --out / eval.json": lambda p: check_output(p, "out", own=[mine]),
        "export --out": lambda p: export_out(Path(p), mine),
        "export --format hf --out": lambda p: hf_export_out(Path(p), mine),
        "sweep --out": lambda p: check_paths(Path(p), ["a"], [0]),
    }


def refused_in_one_line(call, path: str) -> str:
    with pytest.raises(ConfigError) as err:
        call(path)
    message = str(err.value)
    assert message and "\n" not in message and "Traceback" not in message
    return message


@PROPERTY
@given(tail=TAILS, route=st.sampled_from(ROUTES), trailing=st.booleans())
def test_no_spelling_writes_inside_another_run(world, tail, route, trailing):
    before = snapshot(world / "victim")
    path = spelled(world, "victim", tail, route, trailing)
    for call in writers(world).values():
        refused_in_one_line(call, path)
    if tail:  # the run dir itself may be resumed; anything inside it is another run's
        assert "lies inside the run dir" in refused_in_one_line(check_run_path, path)
    else:
        assert check_run_path(path) == world / "victim"
    assert snapshot(world / "victim") == before
    assert not (world / "d" / "zz").exists()


@PROPERTY
@given(tail=TAILS.filter(lambda t: not t.startswith((".", "checkpoints", "summary"))), route=st.sampled_from(ROUTES))
def test_any_spelling_of_a_plain_folder_is_accepted_resolved(world, tail, route):
    path = spelled(world, "plain", tail, route, trailing=False)
    real = Path(os.path.realpath(path))
    assert check_run_path(path) == real
    assert check_output(path, "out") == real
    assert modes.out_dir(path, str(world / "mine"), []) == real
    assert not (world / "d" / "zz").exists() and not any((world / "plain").iterdir())  # the guards write nothing


@PROPERTY
@given(tail=TAILS, route=st.sampled_from(ROUTES))
def test_inside_the_run_a_command_reads_only_new_names(world, tail, route):
    """decode run=, eval, export, speculative and compare may write beside the run they read, never on its files."""
    path = spelled(world, "mine", tail, route, trailing=False)
    first = tail.split("/")[0]
    if first in ("", "checkpoints", ".hydra", LOCK_FILE, "summary.json"):
        message = refused_in_one_line(lambda p: check_output(p, "out", own=[world / "mine"]), path)
        assert "own" in message or "itself" in message
    else:
        assert check_output(path, "out", own=[world / "mine"]) == Path(os.path.realpath(path))


@PROPERTY
@given(text=st.text(st.sampled_from("aé漢 "), max_size=60), at=st.sampled_from(["dir", "file"]))
def test_names_over_255_bytes_are_refused_up_front_by_every_writer(world, text, at):
    name = "x" + text + "é" * 128  # over 255 bytes, however many characters
    path = str(world / "plain" / name / "out") if at == "dir" else str(world / "plain" / name)
    for call in [*writers(world).values(), check_run_path]:
        message = refused_in_one_line(call, path)
        assert f"at most {NAME_MAX} bytes" in message
    assert not any((world / "plain").iterdir())


def test_a_sweep_arm_whose_run_names_pass_255_bytes_is_refused_before_anything_is_written(tmp_path):
    arm = "a" * 250  # its dir fits; its generated config <arm>__seed0.yaml does not
    with pytest.raises(ConfigError, match=rf"^arm name: the name 'a{{40}}\.\.\.' is 262 bytes; .* {NAME_MAX} bytes"):
        check_paths(tmp_path / "sweep", [arm], [0])
    with pytest.raises(ConfigError, match="is 256 bytes"):
        check_paths(tmp_path / "sweep", ["a" * 256], [0])
    check_paths(tmp_path / "sweep", ["a" * 200], [0], lrs=[1e-3])
    assert not (tmp_path / "sweep").exists()


PATH_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=20).filter(
    lambda t: "${" not in t and "/" not in t and t.strip() not in ("", ".", "..")
)


@settings(max_examples=200, deadline=None)
@given(name=PATH_TEXT)
def test_every_override_the_sweep_writes_reads_back_as_the_same_path(name):
    """Spaces, commas, '=', brackets, quotes and non-ASCII in the sweep dir: Hydra reads back the very path."""
    sweep_dir = Path("/tmp") / name / "sw"
    run = PlannedRun("a", 0, ("seed=0",))
    parse = OverridesParser.create().parse_overrides
    got = {o.key_or_group: o.value() for o in parse(launch_command([run], sweep_dir, [])[2:])}
    assert got["hydra.sweep.dir"] == str(sweep_dir) and got["hydra.searchpath"] == [f"file://{sweep_dir}/.plan"]
    got = {o.key_or_group: o.value() for o in parse(single_command(run, sweep_dir)[1:])}
    assert got["hydra.run.dir"] == str(sweep_dir / "a" / "seed0")
    assert got["hydra.searchpath"] == [f"file://{sweep_dir}/.plan"]
    [last] = parse(plain_command(run, sweep_dir)[-1:])
    assert last.value() == str(sweep_dir / "a" / "seed0")


# ---- one real CLI per writer: exit 2, one line on stderr, the other run's files untouched ----


def one_line_refusal(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


@pytest.fixture
def victim(tmp_path) -> Path:
    (tmp_path / "d").mkdir()
    (tmp_path / "link").symlink_to(fake_run(tmp_path / "victim"))
    return tmp_path / "victim"


def test_compare_out_spelled_through_dotdot_into_a_run_is_refused(tmp_path, victim):
    sweep = write_sweep(tmp_path / "sw", [{"seed": 0}, {"seed": 1}, {"seed": 0, "choices": {"mlp": "swiglu"}}])
    before = snapshot(victim)
    out = f"{tmp_path}/d/zz/../../victim"
    line = one_line_refusal(run_cli("gptlab.cli.compare", str(sweep), "--out", out, "--no-wandb", cwd=tmp_path))
    assert "lies inside the run dir" in line and str(victim) in line
    assert snapshot(victim) == before
    for mode in (modes.tables, modes.lr_grid, modes.ladder):  # every mode goes through the same out_dir
        with pytest.raises(ConfigError, match="lies inside the run dir"):
            mode(modes.Request(paths=[str(sweep)], out=f"{tmp_path}/link/"))
    assert snapshot(victim) == before


def test_train_run_dir_inside_a_runs_checkpoints_is_refused_before_hydra_writes(tmp_path, victim):
    before = snapshot(victim)
    done = run_cli("gptlab.cli.train", f"hydra.run.dir={tmp_path}/d/zz/../../victim/checkpoints", cwd=tmp_path)
    line = one_line_refusal(done)
    assert line.startswith("error: hydra.run.dir=") and "lies inside the run dir" in line
    assert snapshot(victim) == before  # no .hydra/ or train.log in its checkpoints/
    assert not (tmp_path / "d" / "zz").exists()


def test_decode_run_dir_through_a_symlink_into_a_run_is_refused(tmp_path, victim):
    before = snapshot(victim)
    line = one_line_refusal(run_cli("gptlab.cli.decode", f"hydra.run.dir='{tmp_path}/link/my decode'", cwd=tmp_path))
    assert "lies inside the run dir" in line
    assert snapshot(victim) == before


def test_export_out_through_a_symlink_into_another_run_is_refused(tmp_path, victim):
    mine = fake_run(tmp_path / "mine")
    before = snapshot(victim)
    line = one_line_refusal(run_cli("gptlab.cli.export", str(mine), "--out", f"{tmp_path}/link/exp", cwd=tmp_path))
    assert line.startswith(f"error: --out={tmp_path}/link/exp: lies inside the run dir {victim}")
    assert snapshot(victim) == before


def test_speculative_out_through_a_symlink_into_another_run_is_refused(tmp_path, victim):
    mine = fake_run(tmp_path / "mine")
    before = snapshot(victim)
    args = ["--target", str(mine), "--draft", str(mine), "--out", f"{tmp_path}/link/spec.json"]
    assert "lies inside the run dir" in one_line_refusal(run_cli("gptlab.cli.speculative", *args, cwd=tmp_path))
    assert snapshot(victim) == before


def test_eval_of_a_folder_inside_a_run_never_writes_there(tmp_path, victim):
    pytest.importorskip("lm_eval", reason="gptlab[eval] not installed (the floor venv): gptlab-eval stops before")
    before = snapshot(victim)
    done = run_cli("gptlab.cli.eval", f"{tmp_path}/d/zz/../../victim/checkpoints", "--tasks", "x", "--no-wandb")
    assert "lies inside the run dir" in one_line_refusal(done)
    assert snapshot(victim) == before


def test_sweep_out_inside_a_finished_run_is_refused_and_nothing_written(tmp_path, victim):
    path = tmp_path / "sw.yaml"
    path.write_text(yaml.safe_dump({"seeds": [0], "overrides": ["train.max_steps=2"], "arms": {"a": []}}))
    before = snapshot(victim)
    for out in (f"{tmp_path}/link/sweep", f"{tmp_path}/d/zz/../../victim"):
        line = one_line_refusal(run_cli("gptlab.cli.sweep", str(path), "--out", out, "--dry-run", cwd=tmp_path))
        assert line.startswith("error: --out=") and ("lies inside the run dir" in line or "itself" in line)
    assert snapshot(victim) == before
    long = tmp_path / "long.yaml"
    long.write_text(yaml.safe_dump({"seeds": [0], "overrides": [], "arms": {"a" * 300: []}}))
    done = run_cli("gptlab.cli.sweep", str(long), "--out", str(tmp_path / "o"), "--dry-run", cwd=tmp_path)
    assert f"at most {NAME_MAX} bytes" in one_line_refusal(done)
    assert not (tmp_path / "o").exists()


@pytest.mark.slow  # one real 2-step run through the sweep's local queue (~20 s on a loaded 2-core machine)
def test_a_sweep_into_a_dir_with_spaces_commas_and_non_ascii_runs(tmp_path):
    path = tmp_path / "sw.yaml"
    tiny = ["model.n_layer=1", "model.d_model=32", "model.n_head=4", "model.block_size=32", "train.batch_size=4"]
    tiny += ["train.eval_sequences=8", "sample.tokens=0", "logger=none", "hardware.dtype=fp32", "train.max_steps=2"]
    path.write_text(yaml.safe_dump({"seeds": [0], "overrides": [*tiny, "train.eval_interval=2"], "arms": {"a": []}}))
    out = tmp_path / "my out, é (1)"
    done = run_cli("gptlab.cli.sweep", str(path), "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert yaml.safe_load((out / "a" / "seed0" / "summary.json").read_text())["status"] == "finished"
