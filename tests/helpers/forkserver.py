"""A fork server for the CLI subprocesses of the tests: `python -m MODULE ARGS` without paying for `import torch`.

Why: a test that runs a CLI as a process pays ~3 s of imports (torch 1.3 s, torch._dynamo 1.7 s on the 2-core CI
machine) before the CLI does anything; a few hundred such processes were a third of the suite's CPU
(docs/DEVELOPMENT.md, "What one process costs").

How: a pytest worker starts a server process (this file run as a script) that imports torch, torch._dynamo,
numpy, hydra and omegaconf once and then waits on a Unix socket. For each request it forks; the forked child takes
the caller's stdin/stdout/stderr (passed as file descriptors), working directory, environment and argv, replaces
`__main__` and `sys.path[0]` as `python -m` does, and runs the module with runpy's `_run_module_as_main` as the last
statement of this script, so exit codes, uncaught tracebacks, SystemExit, atexit handlers and thread joins are the
interpreter's own. The child is a real process with its own pid (a test may signal it); only the imports above were
done before it existed.

A worker keeps a server per set of variables read at import time (PYTHON*, OMP_*, MKL_*, TORCH*, LD_*, LC_*, ...:
`_IMPORT_TIME_ENV`), started with the second request that sets them so; a request only ever reaches a server whose
environment agrees with its own in all of them. run_forked answers None, and run_cli starts a fresh interpreter,
for the first request of such a set, a set past the cap, a preexec_fn (a callable of the caller's process), or a
server that could not start or printed anything while importing (a warning torch printed once at import would
otherwise be missing from every child's stderr). GPTLAB_TEST_FORKSERVER=0 turns it off for a whole run.
"""

from __future__ import annotations

import atexit
import gc
import json
import locale
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

# Modules the server imports before it forks: heavy, and reading nothing at import that a test changes per run.
# Not here: datasets and huggingface_hub (HF_* offline switches are read at import), matplotlib (MPLCONFIGDIR),
# wandb (its settings), gptlab itself (every child imports the code under test afresh).
PRELOAD = ("torch", "torch._dynamo", "numpy", "hydra", "omegaconf")

# Environment variables read while the PRELOAD modules import (thread pools, allocators, paths, encodings): a request
# only reaches a server started with the same values of all of them.
_IMPORT_TIME_ENV = (
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
# gptlab-eval sets TQDM_DISABLE before anything imports it (gptlab.interop.quiet): with tqdm kept, lm-eval's bars
# came back in the forked gptlab-eval (test_interop_quiet caught it).
FRESH_IN_CHILD = ("tqdm",)

_READY = "ready"
_START_TIMEOUT_S = 180


# ---------------------------------------------------------------------------------------------------------------
# The client side, in the pytest worker: servers started on first use.


class _Server:
    """One server process, started with an environment; serves requests that agree with it at import time."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="gptlab-fork-"))
        self.path = self.folder / "s"
        self.env = dict(env)
        self.proc: subprocess.Popen | None = subprocess.Popen(
            [sys.executable, __file__, str(self.path)],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as waiting:
            waiting.register(self.proc.stdout, selectors.EVENT_READ)
            ready = waiting.select(_START_TIMEOUT_S)
        line = self.proc.stdout.readline().strip() if ready else f"not ready in {_START_TIMEOUT_S} s"
        self.proc.stdout.close()
        if line != _READY:
            self.stop()
            print(f"fork server off ({line or 'no answer'}): CLIs run as fresh interpreters", file=sys.stderr)
        atexit.register(self.stop)

    def serving(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None
        if self.folder.exists():
            for p in self.folder.glob("*"):
                p.unlink()
            self.folder.rmdir()


# This worker's servers, one per set of import-time variables asked for twice (cli_env's OMP_NUM_THREADS=1,
# train_env's 2, ...), at most _MAX_SERVERS (~0.5 GB each). A set's first request, and any past the cap, runs as a
# fresh interpreter: a server costs the imports it saves, so a set used once is cheaper without one.
_SERVERS: dict[tuple[tuple[str, str], ...], _Server] = {}
_ASKED: dict[tuple[tuple[str, str], ...], int] = {}
_MAX_SERVERS = 4
_LOCK = threading.Lock()


def _server_for(env: Mapping[str, str]) -> _Server | None:
    key = tuple(sorted((k, v) for k, v in env.items() if k.startswith(_IMPORT_TIME_ENV)))
    with _LOCK:
        _ASKED[key] = _ASKED.get(key, 0) + 1
        if key not in _SERVERS and _ASKED[key] >= 2 and len(_SERVERS) < _MAX_SERVERS:
            _SERVERS[key] = _Server(env)
        server = _SERVERS.get(key)
    return server if server is not None and server.serving() else None


def enabled() -> bool:
    return os.environ.get("GPTLAB_TEST_FORKSERVER", "1") != "0"


def run_forked(
    module: str,
    args: Sequence[str],
    *,
    cwd: Path | str | None,
    env: Mapping[str, str],
    timeout: float | None,
    input: str | None,
) -> subprocess.CompletedProcess | None:
    """`python -m MODULE ARGS` as a child of this worker's fork server, run to the end like subprocess.run(...,
    capture_output=True, text=True); None where the server cannot stand for a fresh interpreter (run one instead)."""
    if not enabled():
        return None
    server = _server_for(env)
    if server is None:
        return None
    path = server.path
    cmd = [sys.executable, "-m", module, *args]
    request = {"module": module, "args": list(args), "cwd": os.path.abspath(cwd or os.getcwd()), "env": dict(env)}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError:  # the server went away since it was asked: a fresh interpreter then
        conn.close()
        return None
    in_r, in_w = os.pipe() if input is not None else (os.dup(0), -1)  # no input: the caller's stdin, as Popen does
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [in_r, out_w, err_w])
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)
    replies = conn.makefile("r")
    line = replies.readline()
    if not line:
        raise RuntimeError(f"the fork server at {path} closed the connection before starting {module}")
    pid = int(json.loads(line)["pid"])
    deadline = None if timeout is None else time.monotonic() + timeout
    out, err, timed_out = _communicate(in_w, out_r, err_r, (input or "").encode(), deadline)
    if not timed_out:
        conn.settimeout(None if deadline is None else max(deadline - time.monotonic(), 0.01))
        try:
            status = json.loads(replies.readline())["returncode"]
        except TimeoutError:
            timed_out = True
    if timed_out:
        _kill(pid)
        conn.close()
        raise subprocess.TimeoutExpired(cmd, timeout or 0, output=_text(out), stderr=_text(err))
    conn.close()
    return subprocess.CompletedProcess(cmd, int(status), _text(out), _text(err))


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _communicate(in_w: int, out_r: int, err_r: int, data: bytes, deadline: float | None) -> tuple[bytes, bytes, bool]:
    """Write data to the child's stdin (then close it) and read its stdout and stderr to EOF, or until deadline."""
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    sel = selectors.DefaultSelector()
    sel.register(out_r, selectors.EVENT_READ)
    sel.register(err_r, selectors.EVENT_READ)
    if in_w >= 0 and data:
        os.set_blocking(in_w, False)
        sel.register(in_w, selectors.EVENT_WRITE)
    elif in_w >= 0:
        os.close(in_w)
    view, open_fds, timed_out = memoryview(data), 3 if in_w >= 0 and data else 2, False
    while open_fds:
        wait = None if deadline is None else deadline - time.monotonic()
        if wait is not None and wait <= 0:
            timed_out = True
            break
        for key, _ in sel.select(wait):
            fd = key.fd
            if fd == in_w:
                try:
                    view = view[os.write(fd, view[:65536]) :]
                except BrokenPipeError:
                    view = view[:0]
                if not view:
                    sel.unregister(fd)
                    os.close(fd)
                    open_fds -= 1
            else:
                chunk = os.read(fd, 65536)
                if chunk:
                    chunks[fd].append(chunk)
                else:
                    sel.unregister(fd)
                    os.close(fd)
                    open_fds -= 1
    for key in list(sel.get_map().values()):
        sel.unregister(key.fd)
        os.close(key.fd)
    sel.close()
    return b"".join(chunks[out_r]), b"".join(chunks[err_r]), timed_out


def _text(data: bytes) -> str:
    """As subprocess's text mode decodes: the locale's encoding, universal newlines."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


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


def _serve(path: str) -> str:
    """Serve requests on path until the parent goes; return only in a forked child, set up as `python -m` would
    leave the interpreter just before it runs the module (the module's name is returned)."""
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
            if os.getppid() != parent:  # the pytest worker is gone
                sys.exit(0)
            continue
        conn.settimeout(None)
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        while not msg.endswith(b"\n"):
            msg += conn.recv(1 << 20)
        if os.fork() == 0:  # the middleman: forks the child, reports its pid and then its exit status
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            request = json.loads(msg)
            child = os.fork()
            if child == 0:
                conn.close()
                _become(request, fds)
                return request["module"]
            for fd in fds:
                os.close(fd)
            try:
                conn.sendall(json.dumps({"pid": child}).encode() + b"\n")
                _, status = os.waitpid(child, 0)
                conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            finally:
                os._exit(0)
        conn.close()
        for fd in fds:
            os.close(fd)


def _become(request: dict, fds: list[int]) -> None:
    """In the forked child: the caller's stdio, cwd, environment and argv; a fresh __main__ and sys.path[0]."""
    import random
    import types

    import numpy

    sys.stdout.flush()
    sys.stderr.flush()
    for target, fd in zip((0, 1, 2), fds, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # recomputed from this environment's TMPDIR
    for name in [m for m in sys.modules if m.split(".")[0] in FRESH_IN_CHILD]:
        del sys.modules[name]
    random.seed()
    numpy.random.seed()  # a fresh interpreter seeds numpy's global generator from the OS, not from its parent
    sys.argv = [request["module"], *request["args"]]
    sys.path[0] = request["cwd"]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main


if __name__ == "__main__":
    import runpy

    _module = _serve(sys.argv[1])
    runpy._run_module_as_main(_module, alter_argv=True)  # type: ignore[attr-defined]
