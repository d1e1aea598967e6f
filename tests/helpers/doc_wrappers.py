"""The console-script wrappers the docs' runnable blocks run under (tests/test_docs.py): real commands, small sizes.

A block's PATH starts with a folder of wrappers, one per console script of pyproject.toml and torchrun; each is a
small script that runs `wrapped(...)` below:

- gptlab-train, and `torchrun ... -m gptlab.cli.train`: every TINY setting whose key the command does not set
  itself is appended (`gptlab-train logger=csv` keeps its logger; `--help`, `--cfg` and the like get nothing);
- gptlab-sweep: the same overrides (sweep files take them as extra overrides), and `--seeds 0` without `--seeds`;
  `gptlab-sweep status` is left alone;
- gptlab-compare on a sweep dir whose `--detach`ed local queue is still running first waits for one finished run,
  so "compare what has finished" has something to compare;
- a gptlab console script then runs as `python -m MODULE ARGS` forked from the pytest worker's fork server, whose
  socket the block's environment names (SOCKET_ENV; tests/helpers/forkserver.py): the same module, argv, cwd,
  environment and stdio as the installed script, without ~3 s of `import torch` per command. The wrapper waits for
  it, hands on SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2, and exits as it did. Where the server is gone or
  refuses (the block set a variable read at import time, e.g. OMP_NUM_THREADS), and for torchrun, the wrapper
  execs the real script instead: a fresh interpreter;
- a console script of pyproject.toml missing from the venv (an install older than the script) runs its entry point
  through the venv's python.

Only the standard library and gptlab.runtime.forkserver are imported here (not pytest): every command of a block
pays for this module's imports.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The variable naming the fork server's socket in a block's environment (unset: every command starts fresh).
SOCKET_ENV = "GPTLAB_TEST_DOCS_FORKSERVER"

# Appended to gptlab-train / gptlab-sweep commands for each key they do not set (a run of ~5 s on 2 cores).
TINY = [
    "train.max_steps=2",
    "model.n_layer=1",
    "model.d_model=32",
    "model.n_head=8",
    "model.block_size=32",
    "train.batch_size=4",
    "train.eval_sequences=8",
    "sample.tokens=0",
    "logger=none",
    "hardware.peak_flops=1e12",  # skip the per-machine matmul probe (re-run on a busy machine: not cached)
]
NO_TINY = ("--help", "-h", "--cfg", "--hydra-help", "--info", "--shell-completion")
KINDS = {"gptlab-train": "train", "gptlab-sweep": "sweep", "gptlab-compare": "compare", "torchrun": "torchrun"}
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def override_key(arg: str) -> str | None:
    """The config key an override sets (`+a.b=1` -> a.b, `'logger=[x,y]'` -> logger), None for a flag."""
    if arg.startswith("-") or "=" not in arg:
        return None
    return arg.split("=", 1)[0].lstrip("+~")


def tiny_extras(args: list[str]) -> list[str]:
    """The TINY settings whose keys args do not set."""
    given = {override_key(a) for a in args}
    return [t for t in TINY if override_key(t) not in given]


def with_tiny(kind: str, args: list[str]) -> list[str]:
    """What a wrapper of `kind` runs instead of args (see the module docstring)."""
    if any(a in NO_TINY or a.startswith("--shell-completion") for a in args):
        return args
    if kind == "train":
        return [*args, *tiny_extras(args)]
    if kind == "sweep":
        if args[:1] == ["status"]:
            return args
        return [*args, *tiny_extras(args), *([] if "--seeds" in args else ["--seeds", "0"])]
    if kind == "torchrun" and "gptlab.cli.train" in args:
        return [*args, *tiny_extras(args[args.index("gptlab.cli.train") + 1 :])]
    return args


def console_scripts() -> dict[str, str]:
    """pyproject.toml's [project.scripts]: name -> "module:function"."""
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^([\w-]+)\s*=\s*"([\w.:]+)"', section, re.MULTILINE))


WRAPPER = """#!{python}
import sys
sys.path.insert(0, {tests!r})
from helpers.doc_wrappers import wrapped
wrapped({kind!r}, {real!r}, {module!r})
"""


def make_wrappers(folder: Path) -> Path:
    """A bin folder of wrappers for the console scripts and torchrun (the real ones are in the venv's bin/)."""
    venv_bin = Path(sys.executable).parent
    folder.mkdir(parents=True, exist_ok=True)
    entries = {**console_scripts(), "torchrun": ""}
    for name, entry in entries.items():
        script = venv_bin / name
        module = entry.split(":")[0] if entry else None
        if script.exists():
            real = [str(script)]
        elif entry:  # an install older than the script: run its entry point
            func = entry.split(":")[1]
            code = f"import sys; sys.argv[0] = {name!r}; from {module} import {func}; sys.exit({func}())"
            real = [sys.executable, "-c", code]
        else:
            continue
        kind = KINDS.get(name, "plain")
        text = WRAPPER.format(python=sys.executable, tests=str(REPO / "tests"), real=real, kind=kind, module=module)
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def wrapped(kind: str, real: list[str], module: str | None) -> None:
    """A wrapper's whole work: the command with TINY settings, forked where it can be, else the real script."""
    args = with_tiny(kind, sys.argv[1:])
    if kind == "compare":
        for arg in args:
            wait_for_a_finished_run(Path(arg))
    socket_path = os.environ.get(SOCKET_ENV)
    if module is not None and socket_path:
        from gptlab.runtime.forkserver import request

        child = request(socket_path, module, args, cwd=os.getcwd(), env=dict(os.environ), stdio=(0, 1, 2))
        if child is not None:
            for sig in FORWARDED:
                signal.signal(sig, lambda number, _frame: child.send_signal(number))
            code = child.wait()
            if code < 0:  # ended by a signal: end by the same one, as the script's own process would have
                signal.signal(-code, signal.SIG_DFL)
                os.kill(os.getpid(), -code)
            sys.exit(code)
    os.execv(real[0], [*real, *args])


def queue_pid(sweep_dir: Path) -> int | None:
    """The pid of a detached local queue working on sweep_dir, while it runs (a zombie has ended)."""
    try:
        pid = int(json.loads((sweep_dir / ".plan" / "launched.json").read_text()).get("pid"))
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, TypeError):
        return None
    return None if state in ("Z", "X") else pid


def wait_for_a_finished_run(sweep_dir: Path, timeout: float = 300.0) -> None:
    """Return once sweep_dir (if it is a detached sweep still running) holds a finished run, or its queue ended."""
    deadline = time.monotonic() + timeout
    while queue_pid(sweep_dir) and time.monotonic() < deadline:
        for summary in sweep_dir.glob("*/**/summary.json"):
            try:
                if json.loads(summary.read_text()).get("status") == "finished":
                    return
            except ValueError:
                pass  # being written
        time.sleep(0.5)
