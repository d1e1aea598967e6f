"""How fast this machine is right now: a fixed piece of CPU work, timed, so that two timings of the suite can be told
apart from a machine that ran slower (tests/conftest.py --machine-probe; `make test`, `make durations` and CI pass it).

Why: the 2-core CI machine is a virtual one whose speed drifts. On 2026-11-28, minutes apart and with nothing else
running, the same single-thread matmul loop ran 1,506 and 1,130 times in 4 s, and a pure-Python loop 28.7 and
25.2 million times; one tree ran the whole suite in 17 min 53 s and, half an hour later, in 17 min 08 s. A suite's
wall time is comparable to another only beside the speed the machine had while it ran.

What: the best of three timings of each of three pieces of work, one core, run by the suite's controller before the
workers start and after they have finished (the machine otherwise quiet): `python_ms`, dict and string churn like
Hydra's and OmegaConf's composing, `matmul_ms`, fp32 matmuls like a training step's, and `torch_start_ms`, a fresh
interpreter that imports torch, as each of the suite's ~600 processes does. Lower is faster. The third was added on
2026-12-06: two machines whose first two readings agreed (python 54 and 53 ms, matmul 110 and 111 ms) ran the same
tests 1.2x apart, some files 1.5x (docs/DEVELOPMENT.md), and most of the suite is starting processes.
"""

from __future__ import annotations

import subprocess
import sys
import time


def _python_work() -> None:
    counts: dict[str, int] = {}
    for i in range(400_000):
        key = str(i % 997)
        counts[key] = counts.get(key, 0) + i


def _best_ms(work, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - t0)
    return round(1000 * best, 1)


def _fresh_torch() -> None:
    # a bare environment: the same work whatever PYTHONPATH, OMP_* or the suite's caches are set to
    subprocess.run([sys.executable, "-c", "import torch"], check=True, env={"PATH": "/usr/bin:/bin"})


def probe() -> dict[str, float]:
    """{"python_ms": ..., "matmul_ms": ..., "torch_start_ms": ...}: the time of each piece of work (~5 s in all)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        a, b = torch.randn(384, 384, generator=gen), torch.randn(384, 384, generator=gen)

        def matmuls() -> None:
            for _ in range(100):
                a @ b

        return {
            "python_ms": _best_ms(_python_work),
            "matmul_ms": _best_ms(matmuls),
            "torch_start_ms": _best_ms(_fresh_torch),
        }
    finally:
        torch.set_num_threads(threads)


def line(start: dict[str, float], end: dict[str, float]) -> str:
    """The summary line: each piece of work's time at the start and at the end of the run."""
    parts = [f"{name.removesuffix('_ms')} {start[name]:.0f} -> {end[name]:.0f} ms" for name in start]
    return "machine probe (fixed work on one core, lower is faster; start -> end): " + ", ".join(parts)
