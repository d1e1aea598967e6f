"""The tests' use of gptlab's fork server: a test's CLI subprocess without paying for `import torch`.

Why: a test that runs a CLI as a process pays ~3 s of imports (torch 1.3 s, torch._dynamo 1.7 s on the 2-core CI
machine) before the CLI does anything; a few hundred such processes were a third of the suite's CPU
(docs/DEVELOPMENT.md, "What one process costs").

How: the product's `gptlab.runtime.forkserver` (the server the local sweep queue starts its runs from) forks each
child from an interpreter that imported torch, torch._dynamo, numpy, hydra and omegaconf once; the child is
`python -m MODULE ARGS` with the caller's stdio, cwd, environment and argv. This module keeps a worker's servers,
one per set of variables read at import time (cli_env's OMP_NUM_THREADS=1, train_env's 2, ...), started with the
second request that sets them so. run_forked runs a request to the end like subprocess.run(capture_output=True,
text=True); start_forked returns it running behind the product's Popen-like handle, for the tests that kill or
signal it (helpers.cli.start_cli); socket_for hands the server's socket to processes that ask it themselves (the
docs' wrappers). All three answer None, and the caller starts a fresh interpreter, for the first request
of such a set, a set past the cap, a preexec_fn (a callable of the caller's process), or a server that could not
start or printed anything while importing. GPTLAB_TEST_FORKSERVER=0 turns it off for a whole run.
"""

from __future__ import annotations

import atexit
import locale
import os
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from gptlab.runtime.forkserver import Forked, ForkServer, import_time_env

# This worker's servers, one per set of import-time variables asked for twice, at most _MAX_SERVERS (~0.5 GB each).
# A set's first request, and any past the cap, runs as a fresh interpreter: a server costs the imports it saves, so
# a set used once is cheaper without one.
_SERVERS: dict[tuple[tuple[str, str], ...], ForkServer] = {}
_ASKED: dict[tuple[tuple[str, str], ...], int] = {}
_MAX_SERVERS = 4
_LOCK = threading.Lock()


def _server_for(env: Mapping[str, str]) -> ForkServer | None:
    key = import_time_env(env)
    with _LOCK:
        _ASKED[key] = _ASKED.get(key, 0) + 1
        if key not in _SERVERS and _ASKED[key] >= 2 and len(_SERVERS) < _MAX_SERVERS:
            server = ForkServer(env)
            if server.problem:
                print(f"fork server off ({server.problem}): CLIs run as fresh interpreters", file=sys.stderr)
            atexit.register(server.stop)
            _SERVERS[key] = server
        server = _SERVERS.get(key)
    return server if server is not None and server.serving() else None


def enabled() -> bool:
    return os.environ.get("GPTLAB_TEST_FORKSERVER", "1") != "0"


def socket_for(env: Mapping[str, str]) -> Path | None:
    """The socket of this worker's server for env's import-time variables, for processes that ask it themselves
    (the docs' console-script wrappers, helpers.doc_wrappers); None where there is none (see _server_for)."""
    if not enabled():
        return None
    server = _server_for(env)
    return None if server is None else server.path


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
    in_r, in_w = os.pipe() if input is not None else (os.dup(0), -1)  # no input: the caller's stdin, as Popen does
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        child = server.start(module, args, cwd=cwd, env=env, stdio=(in_r, out_w, err_w))
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)
    if child is None:  # the server went away since it was asked: a fresh interpreter then
        for fd in (in_w, out_r, err_r):
            if fd >= 0:
                os.close(fd)
        return None
    deadline = None if timeout is None else time.monotonic() + timeout
    out, err, timed_out = _communicate(in_w, out_r, err_r, (input or "").encode(), deadline)
    if not timed_out:
        try:
            child.wait(None if deadline is None else max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            timed_out = True
    if timed_out:
        child.kill()
        try:
            child.wait(10)  # its status, so the server's middleman can go
        except subprocess.TimeoutExpired:
            pass
        raise subprocess.TimeoutExpired(child.args, timeout or 0, output=_text(out), stderr=_text(err))
    assert child.returncode is not None
    return subprocess.CompletedProcess(child.args, child.returncode, _text(out), _text(err))


def start_forked(
    module: str, args: Sequence[str], *, cwd: Path | str | None, env: Mapping[str, str], stdout, stderr
) -> Forked | None:
    """`python -m MODULE ARGS` started as a child of this worker's fork server and returned running (Popen-like);
    stdout/stderr a file object, subprocess.DEVNULL or None (this process's). None where the server cannot stand
    for a fresh interpreter (start one instead)."""
    if not enabled():
        return None
    server = _server_for(env)
    if server is None:
        return None
    opened: list[int] = []

    def fd(target, default: int) -> int:
        if target is None:
            return default
        if target == subprocess.DEVNULL:
            opened.append(os.open(os.devnull, os.O_RDWR))
            return opened[-1]
        return target.fileno()

    try:
        return server.start(module, args, cwd=cwd, env=env, stdio=(0, fd(stdout, 1), fd(stderr, 2)))
    finally:
        for each in opened:
            os.close(each)


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
