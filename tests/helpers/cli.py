"""The one way a test runs a CLI as a subprocess: `python -m MODULE ARGS` under the test's hermetic environment.

conftest.py's hermetic_env fixture makes os.environ offline (W&B, HF) with private caches; cli_env() copies it for
a child process. run_cli runs the interpreter running the tests (the project's venv) on a module, with text output
captured, and returns the finished process for the test to assert on. The process is a child of this worker's fork
server (helpers/forkserver.py: torch and Hydra already imported, ~2.5 s less per CLI) wherever that stands for a
fresh interpreter, and a fresh interpreter otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from gptlab.runtime.forkserver import Forked
from helpers import forkserver


def python_bin() -> str:
    """The interpreter running the tests (the project's venv), for subprocess runs of the CLIs."""
    return sys.executable


def cli_env(**extra: str) -> dict[str, str]:
    """Environment for a CLI subprocess: the test env plus short thread counts."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def start_cli(
    module: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    stdout=None,
    stderr=None,
) -> subprocess.Popen | Forked:
    """Start `python -m MODULE ARGS` and return it running, to signal and wait for (pid, poll, wait, send_signal):
    a child of this worker's fork server where that stands for a fresh interpreter, else a fresh one. A real process
    either way, so kill -9, SIGSTOP and SIGTERM land on it as on any other. stdout/stderr: a file object,
    subprocess.DEVNULL or None (this process's); env as run_cli's."""
    env = dict(cli_env() if env is None else env)
    forked = forkserver.start_forked(module, args, cwd=cwd, env=env, stdout=stdout, stderr=stderr)
    if forked is not None:
        return forked
    return subprocess.Popen([python_bin(), "-m", module, *args], cwd=cwd, env=env, stdout=stdout, stderr=stderr)


def run_cli(
    module: str,
    *args: str,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = 300,
    input: str | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess:
    """Run `python -m MODULE ARGS` to the end and return it (returncode, stdout and stderr as text).

    env is the child's whole environment (default: cli_env(); pass cli_env(KEY=value) to add to it); cwd defaults
    to this process's; timeout in seconds (None: no limit) raises subprocess.TimeoutExpired past it; input is
    written to its stdin; preexec_fn runs in the child before the interpreter starts (e.g. a resource limit).
    """
    env = dict(cli_env() if env is None else env)
    if preexec_fn is None:
        forked = forkserver.run_forked(module, args, cwd=cwd, env=env, timeout=timeout, input=input)
        if forked is not None:
            return forked
    return subprocess.run(
        [python_bin(), "-m", module, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
        preexec_fn=preexec_fn,
    )
