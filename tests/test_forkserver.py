"""gptlab's fork server (gptlab/runtime/forkserver.py), as the tests (helpers/forkserver.py) and the local sweep
queue use it, stands for `python -m MODULE` exactly: the same argv, sys.path[0], __main__, cwd, environment, stdin,
stdout, stderr, exit code, traceback, signal death, atexit handlers and thread joins as a fresh interpreter; a fresh
interpreter wherever it cannot stand for one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import forkserver
from helpers.cli import cli_env, run_cli

PROBE = textwrap.dedent(
    """
    import atexit, os, signal, sys, threading, time
    mode = sys.argv[1]
    print(sys.path[0], sys.argv, __name__, __spec__.name, os.getcwd(), os.environ.get("PROBE_VALUE"))
    print("stdin:", sys.stdin.read() if mode == "read" else "-")
    if mode == "threads":
        import torch
        print("torch threads:", torch.get_num_threads())
        atexit.register(lambda: print("atexit ran", flush=True))
        threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined", flush=True))).start()
    if mode == "raise":
        raise ValueError("the probe fails")
    if mode == "signal":
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGTERM)
    if mode == "numpy":
        import numpy
        print(numpy.random.randint(1 << 30))
    if mode == "torch_rng":
        import torch
        print(torch.initial_seed(), torch.rand(3).tolist(), torch.randint(1 << 30, (1,)).item())
    if mode == "modules":
        print("torch imported before the module ran:", "torch" in sys.modules)
    if mode == "sleep":
        print("asleep", flush=True)
        time.sleep(60)
    print("to stderr", file=sys.stderr)
    sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
    """
)


@pytest.fixture(scope="module")
def _servers():
    """This file's own fork servers: the worker's (up to their cap, from whichever tests ran before) stay out of it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(forkserver, "_SERVERS", {})
        mp.setattr(forkserver, "_ASKED", {})
        yield
        for server in forkserver._SERVERS.values():
            server.stop()


@pytest.fixture
def probe(tmp_path, _servers):
    (tmp_path / "gptlab_probe.py").write_text(PROBE)
    return tmp_path


def _forked_module(probe, module, *args, env, input=None):
    """module run through the fork server (asked twice where its import-time variables are new: the first request
    runs as a fresh interpreter)."""
    for _ in range(2):
        done = forkserver.run_forked(module, args, cwd=probe, env=env, timeout=120, input=input)
        if done is not None:
            return done
    raise AssertionError("the fork server did not take the request")


def _forked(probe, *args, env, input=None):
    return _forked_module(probe, "gptlab_probe", *args, env=env, input=input)


def _both(probe, *args, env=None, input=None):
    """The probe run through the fork server and as a fresh interpreter, each to the end."""
    env = env or cli_env(PROBE_VALUE="v=1 ü", PROBE_EXIT="3")
    forked = _forked(probe, *args, env=env, input=input)
    fresh = subprocess.run(
        [sys.executable, "-m", "gptlab_probe", *args], cwd=probe, env=env, capture_output=True, text=True, input=input
    )
    return forked, fresh


@pytest.mark.parametrize("mode", ["read", "plain"])
def test_forked_cli_sees_argv_path_main_cwd_env_stdin_and_exits_as_python_dash_m(probe, mode):
    forked, fresh = _both(probe, mode, "a b", input="line one\nline two" if mode == "read" else None)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.returncode == 3
    assert (
        f"{probe} ['{probe / 'gptlab_probe.py'}', '{mode}', 'a b'] __main__ gptlab_probe {probe} v=1 ü" in forked.stdout
    )
    assert forked.stderr == "to stderr\n"


@pytest.mark.parametrize("threads", ["1", "2"])
def test_forked_cli_runs_atexit_joins_threads_and_gets_the_omp_thread_count_of_its_env(probe, threads):
    forked, fresh = _both(probe, "threads", env=cli_env(OMP_NUM_THREADS=threads))
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.stdout.endswith(f"torch threads: {threads}\nthread joined\natexit ran\n")


def test_an_uncaught_exception_exits_1_with_the_same_last_traceback_lines(probe):
    forked, fresh = _both(probe, "raise")
    assert forked.returncode == fresh.returncode == 1
    assert forked.stderr.splitlines()[-4:] == fresh.stderr.splitlines()[-4:]
    assert forked.stderr.endswith("ValueError: the probe fails\n")


def test_a_child_killed_by_a_signal_reports_the_negative_signal(probe):
    forked, fresh = _both(probe, "signal")
    assert forked.returncode == fresh.returncode == -signal.SIGTERM
    assert forked.stdout == fresh.stdout


def test_each_forked_child_seeds_numpy_afresh(probe):
    draws = {_forked(probe, "numpy", env=cli_env()).stdout.splitlines()[-1] for _ in range(3)}
    assert len(draws) == 3


def test_each_forked_child_seeds_torch_afresh_as_a_fresh_interpreter_does(probe):
    # a fresh interpreter seeds torch's CPU generator from the OS (its initial_seed differs per process); forked
    # children left with the server's generator would all draw the same numbers
    fresh = {run_cli("gptlab_probe", "torch_rng", cwd=probe, preexec_fn=lambda: None).stdout for _ in range(2)}
    forked = {_forked(probe, "torch_rng", env=cli_env()).stdout.splitlines()[-1] for _ in range(3)}
    assert len(fresh) == 2 and len(forked) == 3


def test_timeout_kills_the_child_and_raises_with_the_output_so_far(probe):
    _forked(probe, "plain", env=cli_env())
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as err:
        forkserver.run_forked("gptlab_probe", ["sleep"], cwd=probe, env=cli_env(), timeout=3, input=None)
    assert time.monotonic() - start < 30
    assert "asleep" in err.value.output


def test_run_cli_uses_a_fresh_interpreter_for_a_preexec_fn_or_when_switched_off(probe, monkeypatch):
    _forked(probe, "plain", env=cli_env())
    assert "before the module ran: True" in run_cli("gptlab_probe", "modules", cwd=probe).stdout
    assert (
        "before the module ran: False" in run_cli("gptlab_probe", "modules", cwd=probe, preexec_fn=lambda: None).stdout
    )
    monkeypatch.setenv("GPTLAB_TEST_FORKSERVER", "0")
    assert "before the module ran: False" in run_cli("gptlab_probe", "modules", cwd=probe).stdout


def test_a_pythonpath_or_other_import_time_variable_gets_a_server_started_with_it(probe, tmp_path_factory):
    extra = tmp_path_factory.mktemp("extra")
    (extra / "gptlab_probe_extra.py").write_text("print('found on PYTHONPATH')\n")
    env = cli_env(PYTHONPATH=str(extra))
    first, second = (
        forkserver.run_forked("gptlab_probe_extra", [], cwd=probe, env=env, timeout=120, input=None) for _ in range(2)
    )
    assert first is None  # a set's first request: a fresh interpreter costs less than a server
    assert second is not None and second.stdout == "found on PYTHONPATH\n"


def test_a_module_that_reads_the_environment_at_import_imports_anew_in_the_child(probe):
    # tqdm, imported by torch in the server, reads TQDM_* when imported: the child's TQDM_DISABLE must count
    code = "import sys; print('tqdm' in sys.modules); import tqdm; print(tqdm.tqdm(range(3)).disable)"
    (probe / "gptlab_probe_tqdm.py").write_text(code)
    env = cli_env(TQDM_DISABLE="1")
    forked = _forked_module(probe, "gptlab_probe_tqdm", env=env)
    fresh = subprocess.run(
        [sys.executable, "-m", "gptlab_probe_tqdm"], cwd=probe, env=env, capture_output=True, text=True
    )
    assert forked.stdout == fresh.stdout == "False\nTrue\n"


def test_the_product_handle_polls_waits_signals_and_pins_the_child_to_its_cores(probe):
    """gptlab.runtime.forkserver as the local sweep queue uses it: a Popen-like handle and the slot's cores."""
    from gptlab.runtime.forkserver import ForkServer, request

    server = ForkServer(cli_env())
    try:
        assert server.problem is None and server.serving()
        log = probe / "child.log"
        core = sorted(os.sched_getaffinity(0))[-1]
        code = "import os, time; print(sorted(os.sched_getaffinity(0)), flush=True); time.sleep(60)"
        (probe / "gptlab_probe_pin.py").write_text(code)
        with open(log, "ab") as out:
            child = server.start(
                "gptlab_probe_pin", [], cwd=probe, env=cli_env(), stdio=(0, out.fileno(), out.fileno()), cores=[core]
            )
        assert child is not None and child.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(0.5)
        deadline = time.monotonic() + 60
        while not log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert log.read_text() == f"[{core}]\n"
        child.terminate()
        assert child.wait(30) == -signal.SIGTERM == child.poll()
        child.terminate()  # after its end: a no-op, never a signal to a pid that may be reused
        # a request whose import-time variables differ from the server's is refused, never served wrongly
        assert server.start("gptlab_probe", [], cwd=probe, env=cli_env(OMP_NUM_THREADS="7"), stdio=(0, 1, 2)) is None
        # and by the server itself, for a process that knows only its socket (the docs' wrappers: request)
        assert (
            request(server.path, "gptlab_probe", [], cwd=probe, env=cli_env(OMP_NUM_THREADS="7"), stdio=(0, 1, 2))
            is None
        )
        with open(log, "wb") as out:
            asked = request(server.path, "gptlab_probe", ["plain"], cwd=probe, env=cli_env(PROBE_EXIT="4"),
                            stdio=(0, out.fileno(), out.fileno()))  # fmt: skip
        assert asked is not None and asked.wait(60) == 4 and "to stderr" in log.read_text()
    finally:
        server.stop()
    assert not server.serving() and not server.folder.exists()
    assert server.start("gptlab_probe", [], cwd=probe, env=cli_env(), stdio=(0, 1, 2)) is None  # gone: refused


def test_a_server_started_without_a_locale_serves_requests_in_that_environment(probe):
    """Python adds LC_CTYPE=C.UTF-8 to its own os.environ when it starts without a locale (PEP 538 coercion): the
    server checks a request against the environment it was started with, so it is not refused for that."""
    from gptlab.runtime.forkserver import ForkServer

    env = {k: v for k, v in cli_env().items() if not k.startswith(("LC_", "LANG"))}
    server = ForkServer(env)
    try:
        assert server.problem is None and server.serving()
        with open(probe / "out.log", "wb") as out:
            child = server.start("gptlab_probe", ["plain"], cwd=probe, env=env, stdio=(0, out.fileno(), out.fileno()))
        assert child is not None and child.wait(60) == 0 and "to stderr" in (probe / "out.log").read_text()
    finally:
        server.stop()
