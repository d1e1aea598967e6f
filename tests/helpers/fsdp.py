"""Helpers for the hardware=fsdp_cpu tests: launch N real gloo ranks of gptlab-train, compare curves, drop checkpoints."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

from gptlab.runtime.forkserver import Forked
from gptlab.state import checkpoint
from helpers.cli import start_cli
from helpers.train import FAST

# fp32 (FAST), a checkpoint every 4 steps, clipping active at every step (grad norms here are 1-2), one thread
FSDP = ["hardware=fsdp_cpu", "hardware.threads=1", "train.ckpt_interval=4", "train.grad_clip=0.5"]
ARGS = [*FAST, *FSDP, "train.max_steps=8", "train.eval_interval=4"]  # later overrides of a key win
CURVE = ("step", "train/loss", "val/loss", "train/grad_norm", "train/lr", "tokens")
FLOATS = ("train/loss", "val/loss", "train/grad_norm")
# fp32 on 2 ranks vs 1 process: the same samples, but each gradient is the mean of two half-batch means,
# reduce-scattered, instead of one full-batch mean, so sums run in another order and differ by a few ulps per step
# (measured: at most 5e-7 on losses ~4 and grad norms ~1-2 over 8 steps). AdamW's normalisation keeps this from
# growing over a few steps; 1e-5 is 20x the measured gap and still 1000x below a wrong shard or a per-rank grad norm
# (a norm over one shard would be ~1/sqrt(2) of the global one).
TOLERANCE = 1e-5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(run_dir: Path, world: int, *args: str) -> list[subprocess.Popen | Forked]:
    """`python -m gptlab.cli.train` as `world` ranks with the env torchrun would give them (1: a plain process).

    The ranks are started directly rather than through torchrun's agent, so a test can SIGKILL each of them, the
    way a job dies when its node does; stderr goes to <run_dir>.err<rank>. Each is a child of the worker's fork
    server (helpers.cli.start_cli: torch already imported, ~3 s less a rank), a real process all the same: its own
    pid, gloo group and exit status, killed and stopped like any other.
    """
    port, procs = free_port(), []
    for rank in range(world):
        env = dict(os.environ, OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0")
        if world > 1:
            env |= {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
        with open(f"{run_dir}.err{rank}", "a") as err:
            cli_args = (*ARGS, *args, f"hydra.run.dir={run_dir}")
            procs.append(start_cli("gptlab.cli.train", *cli_args, env=env, stdout=subprocess.DEVNULL, stderr=err))
    return procs


def wait(procs: list[subprocess.Popen | Forked], run_dir: Path, timeout: float = 240) -> None:
    """Every rank exits 0 (else the failure's stderr tail)."""
    codes = [p.wait(timeout=timeout) for p in procs]
    errors = "".join(Path(f"{run_dir}.err{r}").read_text()[-1500:] for r in range(len(procs)))
    assert codes == [0] * len(procs), errors


def train(run_dir: Path, world: int, *args: str) -> Path:
    wait(launch(run_dir, world, *args), run_dir)
    return run_dir


def curve(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: r[k] for k in CURVE if k in r} for r in rows]


def assert_close_curves(got: list[dict], want: list[dict], tol: float = TOLERANCE) -> float:
    """Same rows and keys, equal steps/lr/tokens, floats within tol; returns the largest float difference."""
    assert [sorted(r) for r in got] == [sorted(r) for r in want]
    worst = 0.0
    for a, b in zip(got, want):
        assert {k: v for k, v in a.items() if k not in FLOATS} == {k: v for k, v in b.items() if k not in FLOATS}
        for key in FLOATS:
            if key in a:
                worst = max(worst, abs(a[key] - b[key]))
                assert abs(a[key] - b[key]) <= tol, (a["step"], key, a[key], b[key])
    return worst


def interrupted_copy(run_dir: Path, dest: Path, keep_step: int) -> Path:
    """A copy of a finished run as a kill right after checkpoint `keep_step` leaves it (later ones, summary gone)."""
    shutil.copytree(run_dir, dest, ignore=shutil.ignore_patterns(".gptlab.lock"))
    for path in checkpoint.ckpt_dir(dest).iterdir():
        m = checkpoint.PATTERN.search(path.name)
        if m and int(m.group(1)) > keep_step:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    (dest / "summary.json").unlink()
    return dest
