"""A warm interpreter that starts `python -m MODULE ARGS` processes without paying for `import torch` each time.

Why: a process of gptlab spends ~3 s importing torch and torch._dynamo (torch.optim's first step imports dynamo)
before its first line of work on a 2-core machine; a local sweep of many short runs pays it per run, and the
test suite per CLI it runs (docs/DEVELOPMENT.md, "The fork server").

How: `ForkServer(env)` starts a server process (this file run as a script) that imports PRELOAD once, freezes
those objects out of the garbage collector, and waits on a Unix socket. `start(...)` sends it a request; the server
forks a middleman, which forks the child and reports its pid and then its exit status. The child takes the
caller's stdin/stdout/stderr (passed as file descriptors), working directory, environment, CPU affinity and argv,
replaces `__main__` and `sys.path[0]` as `python -m` does, and runs the module with runpy's `_run_module_as_main`
as the last statement of this script, so exit codes, uncaught tracebacks, SystemExit, atexit handlers and thread
joins are the interpreter's own. The child is a real process with its own pid (signal it like any other).

What it cannot stand for, it refuses (`start` answers None; start a fresh interpreter then): a request whose
variables read at import time (PYTHON*, OMP_*, MKL_*, TORCH*, CUDA*, LD_*, LC_*, ...: IMPORT_TIME_ENV) differ from
the server's (checked by the client and again by the server, so a process that knows only the socket's path,
`request(...)`, is refused too), and a server that is gone or printed or warned while importing (that output
would be missing from every child's). gptlab itself is never preloaded: every child imports it afresh. The server
never touches CUDA (a process must not fork after initialising it); its children may.
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

# Modules the server imports before it forks: heavy, and reading nothing at import that a run changes per run.
# Not here: datasets and huggingface_hub (HF_* offline switches are read at import), matplotlib (MPLCONFIGDIR),
# wandb (its settings), gptlab itself.
PRELOAD = ("torch", "torch._dynamo", "numpy", "hydra", "omegaconf")

# Prefixes of the environment variables read while the PRELOAD modules import (thread pools, allocators, paths,
# encodings): a request only reaches a server started with the same values of all of them.
IMPORT_TIME_ENV = (
    "PYTHON",
    "OMP_",
    "GOMP_",
    "KMP_",
    "MKL_",
    "OPENBLAS_",
    "NUMEXPR_",
    "NPY_",
    "TORCH",
    "PYTORCH_",
    "CUDA",
    "NVIDIA_",
    "LD_",
    "MALLOC_",
    "LC_",
    "LANG",
)

# Preloaded modules that read the environment when imported and that a CLI configures through it before it imports
# them: a child drops them from sys.modules, so they import anew under its own environment. torch imports tqdm, and
# gptlab-eval sets TQDM_DISABLE before anything imports it (gptlab.interop.quiet).
FRESH_IN_CHILD = ("tqdm",)

# Set in every child's environment: a gptlab process takes it out at import (gptlab/__init__.py: FORKED), so what it
# starts in turn does not inherit the claim, and records how it started (provenance.json: hardware.process_start).
# On the CPU a run's peak memory is its process's resident set, and a forked child's leaves out the library pages
# the server mapped (a tiny run: ~290 MB forked against ~340 MB fresh), so runs started both ways are flagged when
# compared (gptlab/compare/tables/analysis.py).
FORKED_ENV = "GPTLAB_FORKED"

_READY = "ready"
START_TIMEOUT_S = 180


def import_time_env(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables of env that the preloads read at import, sorted: two environments share a server iff equal."""
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME_ENV)))


# ---------------------------------------------------------------------------------------------------------------
# The client side: the process that starts the server and asks it for children.


class _Lines:
    """Newline-ended replies read from a socket, each within a timeout, with no state lost to a timeout."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.buffer = conn, b""

    def readline(self, timeout: float | None) -> str | None:
        """The next line ("" at end of stream), or None if it has not come within timeout (None: wait for it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer:
            self.conn.settimeout(None if deadline is None else max(0.0, deadline - time.monotonic()))
            try:
                chunk = self.conn.recv(4096)  # timeout 0: a non-blocking look
            except (TimeoutError, BlockingIOError):
                return None
            if not chunk:
                return ""
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode() + "\n"


class Forked:
    """A child of the fork server, used like subprocess.Popen: pid, poll(), wait(), send_signal(), terminate()."""

    def __init__(self, args: list[str], pid: int, replies: _Lines) -> None:
        self.args, self.pid = args, pid
        self.returncode: int | None = None
        self._replies = replies

    def _read_status(self, timeout: float | None) -> int | None:
        """The exit status from the middleman, waiting up to timeout (None: until it comes)."""
        line = self._replies.readline(timeout)
        if line is None:
            return None
        # no line: the middleman died without a word (killed); the child's status went with it
        self.returncode = int(json.loads(line)["returncode"]) if line else -signal.SIGKILL
        self._replies.conn.close()
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read_status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and self._read_status(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never signal a pid that may have been reaped and reused
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """One server process, started with an environment; forks children for requests that agree with it."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="gptlab-fork-"))
        self.path = self.folder / "s"
        self.key = import_time_env(env)
        self.problem: str | None = None
        self.proc: subprocess.Popen | None = subprocess.Popen(
            [sys.executable, __file__, str(self.path), json.dumps(self.key)],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as waiting:
            waiting.register(self.proc.stdout, selectors.EVENT_READ)
            ready = waiting.select(START_TIMEOUT_S)
        line = self.proc.stdout.readline().strip() if ready else f"not ready in {START_TIMEOUT_S} s"
        self.proc.stdout.close()
        if line != _READY:
            self.problem = line or "it exited without a word"
            self.stop()

    def serving(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(
        self,
        module: str,
        args: Sequence[str],
        *,
        cwd: Path | str | None,
        env: Mapping[str, str],
        stdio: tuple[int, int, int],
        cores: Sequence[int] | None = None,
    ) -> Forked | None:
        """`python -m MODULE ARGS` as a child with these stdin/stdout/stderr file descriptors (the caller keeps and
        closes its own), cwd, whole environment and CPU affinity; None where this server cannot stand for a fresh
        interpreter (gone, or env disagrees at import time): start one instead."""
        if not self.serving() or import_time_env(env) != self.key:
            return None
        return request(self.path, module, args, cwd=cwd, env=env, stdio=stdio, cores=cores)

    def stop(self) -> None:
        """Stop the server (its children run on to their end) and remove its socket."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None
        if self.folder.exists():
            for p in self.folder.glob("*"):
                p.unlink()
            self.folder.rmdir()


def request(
    path: Path | str,
    module: str,
    args: Sequence[str],
    *,
    cwd: Path | str | None,
    env: Mapping[str, str],
    stdio: tuple[int, int, int],
    cores: Sequence[int] | None = None,
) -> Forked | None:
    """ForkServer.start for a process that did not start the server and knows only its socket's path (a test's
    wrapper of a console script): None where the server is gone or refuses, because env's import-time variables
    differ from those it was started with (start a fresh interpreter then)."""
    cmd = [sys.executable, "-m", module, *args]
    message = {
        "module": module,
        "args": list(args),
        "cwd": os.path.abspath(cwd or os.getcwd()),
        "env": dict(env),
        "cores": None if cores is None else list(cores),
    }
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
        socket.send_fds(conn, [json.dumps(message).encode() + b"\n"], list(stdio))
    except OSError:  # the server went away since it was asked
        conn.close()
        return None
    replies = _Lines(conn)
    line = replies.readline(None)
    reply = json.loads(line) if line else {}
    if "pid" not in reply:  # gone, or refused (another import-time environment)
        conn.close()
        return None
    return Forked(cmd, int(reply["pid"]), replies)


# ---------------------------------------------------------------------------------------------------------------
# The server (this file as a script). Everything below runs in the server or in its forked children.


def _preload() -> str | None:
    """Import PRELOAD with fd 2 sent to a file; what they printed or warned, or None if nothing."""
    import importlib
    import warnings

    saved = os.dup(2)
    with tempfile.TemporaryFile() as noise:
        os.dup2(noise.fileno(), 2)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for name in PRELOAD:
                    importlib.import_module(name)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        noise.seek(0)
        printed = noise.read().decode(errors="replace").strip()
    if caught or printed:
        return f"importing {', '.join(PRELOAD)} warned or printed: {caught[0].message if caught else printed[:200]}"
    return None


def _serve(path: str, key: str) -> str:
    """Serve requests on path until the parent goes, each only if its import-time variables are `key` (JSON: those
    of the environment the server was started with, as its client saw them; not this process's os.environ, to
    which Python adds LC_CTYPE when it starts without a locale, PEP 538); return only in a forked child, set up as
    `python -m` would leave the interpreter just before it runs the module (the module's name is returned)."""
    own = tuple((name, value) for name, value in json.loads(key))
    problem = _preload()
    if problem:
        print(problem.replace("\n", " "), flush=True)
        sys.exit(1)
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    listener.settimeout(1.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the server never waits for its middlemen
    # The imported objects move to gc's permanent generation: a child's collections (and the one at its exit) skip
    # them, so they are neither copied on write nor torn down object by object (a child's exit: 0.9 s -> 0.2 s)
    gc.freeze()
    print(_READY, flush=True)
    quiet = os.open(os.devnull, os.O_RDWR)  # nobody reads the server's output after this line
    for fd in (0, 1, 2):
        os.dup2(quiet, fd)
    os.close(quiet)
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if os.getppid() != parent:  # the process that started the server is gone
                sys.exit(0)
            continue
        conn.settimeout(None)
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        while not msg.endswith(b"\n"):
            msg += conn.recv(1 << 20)
        asked = json.loads(msg)
        if import_time_env(asked["env"]) != own:  # a client that did not check: refused, never served wrongly
            conn.sendall(json.dumps({"refused": "another import-time environment"}).encode() + b"\n")
        elif os.fork() == 0:  # the middleman: forks the child, reports its pid and then its exit status
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            child = os.fork()
            if child == 0:
                conn.close()
                _become(asked, fds)
                return asked["module"]
            for fd in fds:
                os.close(fd)
            # a ^C or a signal to the whole process group is for the child: the middleman stays to report its end
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
            try:
                conn.sendall(json.dumps({"pid": child}).encode() + b"\n")
                _, status = os.waitpid(child, 0)
                conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            finally:
                os._exit(0)
        conn.close()
        for fd in fds:
            os.close(fd)


def _become(asked: dict, fds: list[int]) -> None:
    """In the forked child: the caller's stdio, cwd, environment, affinity and argv; a fresh __main__ and
    sys.path[0]."""
    import random
    import types

    import numpy

    sys.stdout.flush()
    sys.stderr.flush()
    for target, fd in zip((0, 1, 2), fds, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.chdir(asked["cwd"])
    os.environ.clear()
    os.environ.update(asked["env"])
    os.environ[FORKED_ENV] = "1"
    if asked.get("cores") is not None:
        os.sched_setaffinity(0, asked["cores"])  # before any thread starts: every thread inherits it
    tempfile.tempdir = None  # recomputed from this environment's TMPDIR
    for name in [m for m in sys.modules if m.split(".")[0] in FRESH_IN_CHILD]:
        del sys.modules[name]
    random.seed()
    numpy.random.seed()  # a fresh interpreter seeds numpy's global generator from the OS, not from its parent
    torch = sys.modules.get("torch")
    if torch is not None:  # and torch its CPU generator (the CUDA ones keep their fixed default seed, as fresh)
        torch.default_generator.seed()
    sys.argv = [asked["module"], *asked["args"]]
    sys.path[0] = asked["cwd"]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main


if __name__ == "__main__":
    import runpy

    sys.path[0] = os.getcwd()  # not this file's folder: its modules must not shadow what the preloads import
    _module = _serve(sys.argv[1], sys.argv[2])
    runpy._run_module_as_main(_module, alter_argv=True)  # type: ignore[attr-defined]
