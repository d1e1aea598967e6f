"""Fixture and helpers for tests that need a real SLURM cluster (scripts/slurm-cluster.sh up).

Use in a test module:  `from helpers.slurm import slurm_cluster, wait_for_job  # noqa: F401`
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.paths import REPO

CLUSTER_SCRIPT = REPO / "scripts" / "slurm-cluster.sh"
SKIP_REASON = "no SLURM cluster reachable: run scripts/slurm-cluster.sh up"
# Job states after which a job never runs again (unless requeued by hand).
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)
PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SlurmCluster:
    """A reachable cluster: its slurm.conf, default partition and the PATH that puts its sacct first."""

    conf: Path
    partition: str
    path: str

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a subprocess that talks to this cluster (sbatch, submitit, a Hydra app)."""
        env = dict(os.environ, SLURM_CONF=str(self.conf), PATH=self.path)
        env.update(extra)
        return env


def _candidate_conf() -> Path | None:
    """SLURM_CONF if set (from `eval "$(scripts/slurm-cluster.sh env)"`), else the script's default state dir."""
    if os.environ.get("SLURM_CONF"):
        return Path(os.environ["SLURM_CONF"])
    conf = Path(os.environ.get("GPTLAB_SLURM_DIR", "/tmp/gptlab-slurm")) / "etc" / "slurm.conf"
    return conf if conf.is_file() else None


def _path_with_sacct(conf: Path) -> str:
    """PATH with the script's bin/ (its sacct wrapper) first when the conf comes from the script."""
    path = os.environ.get("PATH", "")
    bin_dir = conf.parent.parent / "bin"
    if (bin_dir / "sacct").exists() and str(bin_dir) not in path.split(os.pathsep):
        path = f"{bin_dir}{os.pathsep}{path}"
    return path


@functools.lru_cache(maxsize=1)
def probe_cluster() -> SlurmCluster | str:
    """The reachable cluster, or the reason there is none; asked once per test session."""
    conf = _candidate_conf()
    if conf is None or shutil.which("sinfo") is None:
        return SKIP_REASON
    env = dict(os.environ, SLURM_CONF=str(conf), PATH=_path_with_sacct(conf))
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%P %t"], env=env, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return f"{SKIP_REASON} (sinfo did not answer within {PROBE_TIMEOUT_S:.0f} s, SLURM_CONF={conf})"
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()]
    usable = [p for p, state in rows if state.rstrip("*~#") in ("idle", "mix", "alloc", "comp")]
    if out.returncode != 0 or not usable:
        detail = (out.stderr.strip().splitlines() or ["no usable node"])[-1]
        return f"{SKIP_REASON} ({detail}; SLURM_CONF={conf})"
    default = next((p for p in usable if p.endswith("*")), usable[0])
    return SlurmCluster(conf=conf, partition=default.rstrip("*"), path=env["PATH"])


@pytest.fixture
def slurm_cluster(monkeypatch) -> SlurmCluster:
    """A reachable SLURM cluster with SLURM_CONF/PATH set for this test, or skip with the reason."""
    found = probe_cluster()
    if isinstance(found, str):
        pytest.skip(found)
    monkeypatch.setenv("SLURM_CONF", str(found.conf))
    monkeypatch.setenv("PATH", found.path)
    return found


def _run(cmd: list[str], timeout: float = 15.0) -> subprocess.CompletedProcess:
    """Run a SLURM client command with a bound on its time; raise with its stderr if it fails."""
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


def sbatch(*args: str) -> str:
    """Submit with `sbatch --parsable ARGS` and return the job id (array jobs: the array id)."""
    return _run(["sbatch", "--parsable", *args]).stdout.strip().split(";")[0]


def job_states(job_id: str) -> dict[str, str]:
    """{job id (array tasks as <id>_<task>) -> state} from sacct (the cluster's or the wrapper)."""
    out = _run(["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", str(job_id)])
    states = {}
    for line in out.stdout.splitlines():
        jid, _, state = line.partition("|")
        if jid and "." not in jid:  # skip job steps (12.batch) that real accounting lists
            states[jid] = state.split()[0] if state else "UNKNOWN"  # "CANCELLED by 0" -> CANCELLED
    return states


def job_info(job_id: str) -> dict[str, str]:
    """`scontrol show job -o` as {key: value} (JobState, Restarts, StdOut, ...) for one job."""
    out = _run(["scontrol", "show", "job", "-o", str(job_id)])
    return dict(tok.split("=", 1) for tok in out.stdout.split() if "=" in tok)


def wait_for_state(job_id: str, states: set[str] | frozenset[str], timeout: float = 60.0) -> str:
    """Wait until every task of the job is in one of `states`; return the first task's state."""
    deadline = time.monotonic() + timeout
    current: dict[str, str] = {}
    while time.monotonic() < deadline:
        current = job_states(job_id)
        if current and all(s in states for s in current.values()):
            return next(iter(current.values()))
        time.sleep(0.25)
    raise TimeoutError(f"job {job_id} not in {sorted(states)} after {timeout:.0f} s: {current}")


def wait_for_job(job_id: str, timeout: float = 60.0) -> str:
    """Wait (bounded) until the job (every task of an array) has ended; return COMPLETED or the first other state."""
    wait_for_state(job_id, TERMINAL_STATES, timeout)
    final = job_states(job_id)
    bad = [s for s in final.values() if s != "COMPLETED"]
    return bad[0] if bad else "COMPLETED"


def requeue_job(job_id: str, timeout: float = 30.0) -> int:
    """`scontrol requeue` a running job and return its new Restarts once SLURM has taken it back.

    The requeued job waits out SLURM's restart hold-off (cred_expire + 1 s; the test cluster sets
    cred_expire=10). It must not be forced to start earlier: slurmd revokes the old attempt's credential
    when it kills it, and a new attempt allocated in the same second is killed as "Job credential revoked"
    (job state FAILED) - a race that only shows on a slow machine.
    """
    before = int(job_info(job_id).get("Restarts", "0"))
    _run(["scontrol", "requeue", str(job_id)])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = job_info(job_id)
        restarts = int(info.get("Restarts", "0"))
        if restarts > before and info.get("JobState") in ("PENDING", "RUNNING", "COMPLETING"):
            return restarts
        time.sleep(0.25)
    raise TimeoutError(f"job {job_id} was not requeued within {timeout:.0f} s: {job_info(job_id)}")
