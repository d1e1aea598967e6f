"""Bad input through the real gptlab-train CLI: ONE table of (overrides, environment, exit code, needle).

Each row must end in exactly one stderr line `error: ...` naming the key/file, no traceback, the
expected exit code (2 bad input, 1 the run failed, e.g. a full disk), and a pre-existing run dir
that stays byte-identical. Most rows run in ONE driver process (this file run as a script) that
calls gptlab.cli.train.main() once per row with that row's sys.argv and environment, capturing fd 2:
Hydra clears its global state after every call, so a call is what a fresh process would do. Rows
marked `process` run as real `python -m gptlab.cli.train` processes too.

The rows live in helpers/bad_input_rows.py. Each row is its own test item named by its id (`-k nodes-zero`);
the first one to run makes the inputs and drives every selected row at once (class Batch), then each
item checks only its own outcome.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import pytest

from helpers.bad_input_rows import TABLE, Row
from helpers.cli import cli_env, run_cli
from helpers.train import FAST, run_inprocess

BASE = [*FAST, "train.max_steps=6", "train.eval_interval=3"]  # the config of the finished run {run}
IGNORED = {"train.log", ".gptlab.lock"}  # Hydra appends its job log; gptlab-train's empty lock file


def digest(path: Path) -> dict[str, str]:
    """sha256 of every file under path (or of path itself), Hydra's job log and the lock file left out."""
    files = [path] if path.is_file() else [p for p in sorted(path.rglob("*")) if p.is_file() and p.name not in IGNORED]
    return {str(p.relative_to(path.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def changed(before: dict[str, str], path: Path) -> list[str]:
    after = digest(path)
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def set_env(environ, changes: dict) -> dict:
    """Apply {name: value, or None to unset} to environ; returns the previous values in the same form."""
    previous = {key: environ.get(key) for key in changes}
    for key, value in changes.items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    return previous


def call_main(args: list[str], env: dict) -> tuple[int, str]:
    """gptlab.cli.train.main() with sys.argv = args and env applied; returns (exit code, what reached fd 2)."""
    from gptlab.cli.train import main

    previous = set_env(os.environ, env)
    sys.argv = ["gptlab-train", *args]
    with tempfile.TemporaryFile() as err, open(os.devnull, "w") as null:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(null.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            main()
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        except BaseException:  # noqa: BLE001 - a crash is a test failure, shown with its traceback
            traceback.print_exc()
            code = -1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
        err.seek(0)
        text = err.read().decode(errors="replace")
    set_env(os.environ, previous)
    return code, text


def drive(cases_file: str, results_file: str) -> None:
    """The driver process: every case in-process, each with its own argv, environment and digests."""
    out = []
    for case in json.loads(Path(cases_file).read_text()):
        before = digest(Path(case["keep"]))
        code, stderr = call_main(case["args"], case["env"])
        out.append({"id": case["id"], "code": code, "stderr": stderr, "changed": changed(before, Path(case["keep"]))})
    Path(results_file).write_text(json.dumps(out))


def as_process(case: dict, fsize: int | None) -> dict:
    """One case as a real `python -m gptlab.cli.train` process (optionally under a file size limit)."""
    env = cli_env(OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0")
    if fsize:  # GIT_DIR names no repository: a checkout's uncommitted changes (git.diff) must not be what outgrows it
        env["GIT_DIR"] = str(Path(case["keep"]).parent / "no-repository")
    set_env(env, case["env"])
    limit = (lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, resource.RLIM_INFINITY))) if fsize else None
    keep = Path(case["keep"])
    before = digest(keep)
    proc = run_cli("gptlab.cli.train", *case["args"], env=env, timeout=120, preexec_fn=limit)
    return {"id": case["id"], "code": proc.returncode, "stderr": proc.stderr, "changed": changed(before, keep)}


def make_inputs(tmp: Path) -> dict[str, str]:
    """The files and run dirs the rows point at; returns the {placeholder} values."""
    import torch

    d = tmp / "inputs"
    d.mkdir()
    (d / "empty.txt").write_text("")
    (d / "latin1.txt").write_bytes("caf\xe9 au lait, ".encode("latin-1") * 50)
    (d / "short.txt").write_text("too short\n")
    (d / "data.csv").write_text("text\nhello\n")
    (d / "bad.jsonl").write_text('{"text": "fine"}\n{"text": broken\n')
    (d / "docs.jsonl").write_text("".join(json.dumps({"body": f"doc {i} " * 40}) + "\n" for i in range(20)))
    torch.save(torch.zeros(3), d / "plain.pt")
    torch.save({"model": {}, "step": 1, "payload": Exploit()}, d / "evil.pt")
    run = tmp / "run"
    run_inprocess(run, steps=6, eval_interval=3)  # {run}: a finished run with the BASE config
    newest = sorted((run / "checkpoints").glob("step_*.pt"))[-1]
    (d / "truncated.pt").write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    for name in ("corrupt", "busy"):
        shutil.copytree(run, tmp / name)
    run_inprocess(tmp / "grow", "schedule=constant", steps=6, eval_interval=3)  # constant: may be extended
    for ckpt in (tmp / "corrupt" / "checkpoints").glob("step_*.pt"):
        ckpt.write_bytes(ckpt.read_bytes()[:1000])
    return {
        "d": str(d),
        "run": str(run),
        "corrupt": str(tmp / "corrupt"),
        "busy": str(tmp / "busy"),
        "grow": str(tmp / "grow"),
        "s": special_files(tmp / "special"),
        **damaged_caches(tmp),
    }


def special_files(s: Path) -> str:
    """{s}: a FIFO, a device behind a symlink, NUL-only and 1 GB sparse files, a symlink loop, a dangling symlink."""
    s.mkdir()
    os.mkfifo(s / "fifo.txt")
    (s / "zero.txt").symlink_to("/dev/zero")
    (s / "nul.txt").write_bytes(bytes(4096))
    with open(s / "sparse.txt", "wb") as f:
        f.truncate(1 << 30)  # no block written: instant, and no disk used
    (s / "loop_a.txt").symlink_to(s / "loop_b.txt")
    (s / "loop_b.txt").symlink_to(s / "loop_a.txt")
    (s / "dangling.txt").symlink_to(s / "missing.txt")
    return str(s)


def damaged_caches(tmp: Path) -> dict[str, str]:
    """{cache_truncated}, {cache_ids}: GPTLAB_CACHE dirs holding {run}'s token cache entry, truncated / with a bad id."""
    import numpy as np

    from gptlab.data.shakespeare import ShakespeareData

    entry = ShakespeareData(seed=0, block_size=64).cache_path  # the BASE data (char tokens), cached by {run}
    copies = {name: tmp / name / "tokens" / entry.name for name in ("cache_truncated", "cache_ids")}
    for copy in copies.values():
        shutil.copytree(entry, copy)
    shard = copies["cache_truncated"] / "shard_00000.bin"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    ids = np.memmap(copies["cache_ids"] / "shard_00000.bin", dtype=np.uint16, mode="r+")
    ids[-1] = 60000  # the char vocabulary has < 100 ids
    ids.flush()
    del ids
    return {name: str(tmp / name) for name in copies}


class Exploit:
    """Pickles as a call to print: torch.load(weights_only=True) must refuse to run it."""

    def __reduce__(self):
        return print, ("code from a checkpoint ran",)


def fill(text: str, values: dict) -> str:
    return text.format(**values) if "{" in text and "${" not in text else text


def case_of(row: Row, values: dict) -> dict:
    """The row's gptlab-train arguments, environment and the path that must stay byte-identical."""
    return {
        "id": row.id,
        "args": [*BASE, *(fill(a, values) for a in row.overrides), f"hydra.run.dir={fill(row.run_dir, values)}"],
        "env": {k: v if v is None else fill(v, values) for k, v in row.env.items()},
        "keep": fill(row.keep, values),
    }


class Batch:
    """The inputs and ONE driver process for every selected row, made lazily by the first row test that runs.

    Lazily (not in the fixture's own setup) so the work runs inside a test, under conftest's hermetic
    environment (offline, private GPTLAB_CACHE), exactly as the single table test did. Only the rows this
    session collected (after -k / node-id selection) are driven, so `-k nodes-zero` drives one row.
    """

    def __init__(self, tmp: Path, rows: list[Row]):
        self.tmp, self.rows = tmp, rows
        self.values: dict | None = None
        self.results: dict[str, dict] = {}
        self.error: str | None = None

    def ensure(self) -> dict:
        """The {placeholder} values; on first use, make the inputs and drive every selected non-fsize row."""
        if self.error is not None:
            pytest.fail(f"the shared driver run failed (see the first row test that ran): {self.error}")
        if self.values is None:
            try:
                self._drive()
            except BaseException as failure:
                self.error = repr(failure)[-3000:]
                raise
        return self.values

    def _drive(self) -> None:
        values = make_inputs(self.tmp)
        driven = [case_of(r, values) for r in self.rows if not r.fsize]
        if driven:
            (self.tmp / "cases.json").write_text(json.dumps(driven))
            with open(Path(values["busy"]) / ".gptlab.lock", "w") as lock:  # a live run holds {busy}
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                driver = subprocess.run(
                    [sys.executable, __file__, str(self.tmp / "cases.json"), str(self.tmp / "results.json")],
                    capture_output=True,
                    text=True,
                    timeout=300,
                    env=dict(os.environ, OMP_NUM_THREADS="1"),
                )
            assert driver.returncode == 0, driver.stderr[-3000:]
            self.results = {r["id"]: r for r in json.loads((self.tmp / "results.json").read_text())}
            assert sorted(self.results) == sorted(c["id"] for c in driven)
        self.values = values


@pytest.fixture(scope="module")
def batch(request, tmp_path_factory) -> Batch:
    selected = {
        item.callspec.params["row"].id
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_bad_input_table" and item.module is request.module
    }
    return Batch(tmp_path_factory.mktemp("bad_input"), [r for r in TABLE if r.id in selected] or TABLE)


def test_table_rows_are_many_and_uniquely_named():
    assert len(TABLE) >= 40 and len({r.id for r in TABLE}) == len(TABLE)


@pytest.mark.slow
@pytest.mark.parametrize("row", TABLE, ids=[r.id for r in TABLE])
def test_bad_input_table(row, batch):
    """One row: its driver outcome (every row without fsize) and, for `process` rows, a real process too."""
    values = batch.ensure()
    outcomes = [] if row.fsize else [("driver", batch.results[row.id])]
    if row.process:
        outcomes.append(("process", as_process(case_of(row, values), row.fsize)))
    failures = [f"{row.id} ({how}): {problem}" for how, result in outcomes for problem in check(result, row, values)]
    assert not failures, "\n".join(failures)


def check(result: dict, row: Row, values: dict) -> list[str]:
    """What is wrong with one row's outcome (empty when it behaved)."""
    lines = [line for line in result["stderr"].splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    needle = fill(row.needle, values)
    problems = []
    if result["code"] != row.code:
        problems.append(f"exit code {result['code']}, expected {row.code}")
    if not last.startswith("error: ") or needle not in last:
        problems.append(f"last stderr line {last!r} lacks 'error: ...{needle}...'")
    progress = [  # a run that started and then failed (exit 1, e.g. a full disk) has printed its progress lines
        line for line in lines[:-1] if row.code == 1 and line.startswith(("step ", "stopped at step "))
    ]
    if len(lines) != 1 + len(progress) or "Traceback" in result["stderr"]:
        problems.append("stderr is not one error line: " + result["stderr"][-1500:])
    if result["changed"]:
        problems.append(f"changed files: {result['changed']}")
    return problems


if __name__ == "__main__":
    drive(sys.argv[1], sys.argv[2])
