"""Shared benchmark plumbing: the run context, subprocess helpers, the bare PyTorch step and the matmul-peak probe."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class BenchError(RuntimeError):
    """A benchmark step failed (a command exited non-zero, a file is missing); the message is one line."""


@dataclass
class Bench:
    """One benchmark run: quick or full sizes, a private work dir, the environment every command gets."""

    quick: bool
    work: Path
    env: dict = field(default_factory=dict)

    def pick(self, full, quick):
        """The quick-mode value in --quick, else the full one."""
        return quick if self.quick else full

    def log(self, msg: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def dir(self, name: str) -> Path:
        """A sub-directory of the work dir (created)."""
        path = self.work / name
        path.mkdir(parents=True, exist_ok=True)
        return path


def hermetic_env(work: Path) -> dict:
    """The environment for every command: W&B offline into the work dir, HF hub offline, a private gptlab cache."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    wandb = work / "wandb"
    for sub in ("dir", "cache", "data", "artifacts", "config"):
        (wandb / sub).mkdir(parents=True, exist_ok=True)
    env.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_DIR=str(wandb / "dir"),
        WANDB_CACHE_DIR=str(wandb / "cache"),
        WANDB_DATA_DIR=str(wandb / "data"),
        WANDB_ARTIFACT_DIR=str(wandb / "artifacts"),
        WANDB_CONFIG_DIR=str(wandb / "config"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        GPTLAB_CACHE=str(work / "gptlab-cache"),
        TORCHINDUCTOR_CACHE_DIR=str(work / "inductor-cache"),
        PYTHONUNBUFFERED="1",
        HYDRA_FULL_ERROR="0",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    return env


def run(
    bench: Bench, args: list[str], cwd: Path | None = None, timeout: float = 1800, stderr_to: Path | None = None
) -> tuple[float, str]:
    """Run a command with the bench env; returns (wall seconds, stdout). Raises BenchError with the stderr tail.
    stderr_to: a file that keeps the command's whole stderr (warnings a check reads)."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            args, cwd=cwd or bench.work, env=bench.env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise BenchError(f"timed out after {timeout:.0f}s: {' '.join(args[:6])} ...") from None
    wall = time.perf_counter() - t0
    if stderr_to is not None:
        stderr_to.write_text(proc.stderr or "")
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        raise BenchError(f"exit {proc.returncode}: {' '.join(args[:8])} ...: {tail}")
    return wall, proc.stdout


def gptlab(tool: str) -> list[str]:
    """The command for a gptlab entry point with this interpreter (gptlab-train -> python -m gptlab.cli.train)."""
    return [sys.executable, "-m", f"gptlab.cli.{tool}"]


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise BenchError(f"{path}: cannot read ({type(err).__name__})") from None


def read_rows(path: Path) -> list[dict]:
    """The rows of a metrics.jsonl, under today's metric names (gptlab/util/metric_names.py)."""
    from gptlab.util.metric_names import canonical

    if not path.is_file():
        raise BenchError(f"{path}: missing (the run wrote no metrics)")
    return [canonical(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def median(values) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return float(statistics.median(values)) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _busy_and_own() -> tuple[float, float]:
    """(CPU seconds all processes have used, incl. hypervisor steal; CPU seconds this process and its children used)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
    t = os.times()
    return busy / os.sysconf("SC_CLK_TCK"), t.user + t.system + t.children_user + t.children_system


class CpuMeter:
    """`with CpuMeter() as m: ...` -> m.foreign: share of the machine's cores other processes used meanwhile.

    Children count as ours once waited for, so measure around whole commands. 0 = the machine was ours alone.
    """

    foreign: float = 0.0

    def __enter__(self):
        self.t0, (self.busy0, self.own0) = time.perf_counter(), _busy_and_own()
        return self

    def __exit__(self, *exc):
        busy, own = _busy_and_own()
        span = (time.perf_counter() - self.t0) * (os.cpu_count() or 1)
        self.foreign = min(1.0, max(0.0, (busy - self.busy0) - (own - self.own0)) / span) if span > 0 else 0.0
        return False


def wait_quiet(bench: Bench, max_s: float, share: float = 0.1) -> float:
    """Wait (up to max_s) until other processes use less than `share` of the cores for a second; returns the wait."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < max_s:
        with CpuMeter() as m:
            time.sleep(1.0)
        if m.foreign < share:
            break
    waited = time.perf_counter() - t0
    if waited > 1.5:
        bench.log(f"waited {waited:.0f}s for other processes to leave the cores")
    return waited


QUIET = 0.15  # a sample is "quiet" when other processes used less than this share of the cores


def quiet(samples: list[dict], min_n: int = 2) -> list[dict]:
    """The samples taken while the machine was quiet ({"foreign": share, ...}), or all if fewer than min_n were."""
    calm = [s for s in samples if s["foreign"] < QUIET]
    return calm if len(calm) >= min_n else samples


def bare_step(model, forward, optimizer, autocast, x, y, grad_clip: float) -> None:
    """A plain PyTorch training step: forward under autocast, backward, clip, AdamW step, zero grads."""
    with autocast():
        _, loss = forward(x, y)
    loss.backward()
    if grad_clip > 0:
        import torch

        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def build_platform(overrides: list[str], compile_model: bool = False) -> dict:
    """Model, optimizer, hardware and data exactly as gptlab-train builds them for these overrides."""
    import torch

    from gptlab.config import build

    cfg = build.compose(overrides)
    hardware = build.build_hardware(cfg)
    data = build.build_data(cfg, int(cfg.model.block_size))
    torch.manual_seed(int(cfg.seed))
    model = build.build_model(cfg, vocab_size=data.vocab_size, device=hardware.device)
    optimizer = build.build_optimizer(cfg, model)
    forward = torch.compile(model) if compile_model else model
    return {
        "cfg": cfg,
        "hardware": hardware,
        "data": data,
        "model": model,
        "optimizer": optimizer,
        "forward": forward,
        "batch_size": int(cfg.train.batch_size),
        "grad_clip": float(cfg.train.grad_clip),
    }


class PeakProbe:
    """Matmul FLOP/s measured next to the thing it is compared with (gptlab.runtime.peak's measurement, short).

    The matmul's size is fitted once per dtype (peak.fitting_size: an emulated bf16 one on a CPU without native bf16
    is cut down) and kept, so each probe times only its matmuls; `sizes` says what each dtype was measured at."""

    BUDGET_S = 0.5

    def __init__(self, n: int):
        self.n = n
        self.samples: dict[str, list[float]] = {"bf16": [], "fp32": []}
        self.sizes: dict[str, int] = {}

    def __call__(self, dtype: str) -> float:
        import torch

        from gptlab.runtime.peak import fitting_size, measure_matmul_peak

        torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        if dtype not in self.sizes:
            self.sizes[dtype] = fitting_size(torch_dtype, "cpu", self.n, self.BUDGET_S)
        flops = measure_matmul_peak(torch_dtype, n=self.sizes[dtype], repeats=2, budget_s=self.BUDGET_S, fit=False)
        self.samples[dtype].append(flops)
        return flops

    def summary(self) -> dict:
        return {
            f"{dt}_peak_flops_{kind}": fn(vals)
            for dt, vals in self.samples.items()
            if vals
            for kind, fn in (("median", median), ("min", min), ("max", max))
        }


def machine() -> dict:
    """CPU model, cores, RAM, torch and Python versions, the git commit."""
    import platform

    import torch

    from gptlab.runtime.hardware import cpu_has_bf16
    from gptlab.runtime.peak import machine_name

    mem = (
        next(
            (
                int(line.split()[1]) * 1024
                for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")
            ),
            None,
        )
        if Path("/proc/meminfo").is_file()
        else None
    )
    commit = (
        subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        or None
    )
    dirty = bool(
        subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        ).stdout.strip()
    )
    return {
        "cpu": machine_name("cpu"),
        "bf16": "native (avx512_bf16/amx)" if cpu_has_bf16() else "emulated (no avx512_bf16/amx)",
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "ram_bytes": mem,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": commit,
        "git_dirty": dirty,
    }
