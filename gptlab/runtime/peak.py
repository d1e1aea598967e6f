"""Measured hardware roofs: matmul peak FLOP/s and copy bandwidth, cached per machine, torch version and dtype."""

from __future__ import annotations

import json
import logging
import platform
import time
from pathlib import Path

import torch

from gptlab.runtime.cpu_load import LoadSampler
from gptlab.util.io import write_json_atomic

log = logging.getLogger(__name__)
# v2: values are cached only when measured on a quiet machine (v1 files could hold peaks taken under load,
# which made MFU look up to ~2x too high without tripping the > 100 % check)
CACHE_FILE = "hardware_peaks_v2.json"
MAX_OUTSIDE_LOAD = 0.25  # share of all cores other processes may use while a peak is measured for the cache


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _best_time(fn, device: str, repeats: int, budget_s: float) -> float:
    """Fastest of up to `repeats` timed calls (after one warm-up), stopping early after budget_s."""
    fn()
    _sync(device)
    best, start = float("inf"), time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s:
            break
    return best


def measure_matmul_peak(
    dtype: torch.dtype = torch.bfloat16, device: str = "cpu", n: int = 2048, repeats: int = 8, budget_s: float = 1.5
) -> float:
    """FLOP/s of the best of a few (n×n)·(n×n) matmuls in `dtype` on `device` (2·n³ FLOPs each)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    seconds = _best_time(lambda: torch.mm(a, b, out=out), device, repeats, budget_s)
    return 2.0 * n**3 / seconds


def measure_bandwidth(device: str = "cpu", nbytes: int = 256 * 2**20, repeats: int = 8, budget_s: float = 1.0) -> float:
    """Bytes/s of copying a large buffer (counts the read and the write), best of a few."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = _best_time(lambda: dst.copy_(src), device, repeats, budget_s)
    return 2.0 * src.numel() * 4 / seconds


def machine_name(device: str = "cpu") -> str:
    """The processor (or GPU) model name, to key cached measurements."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_key(device: str, what: str) -> str:
    threads = torch.get_num_threads() if not device.startswith("cuda") else 0
    return f"{machine_name(device)} | torch {torch.__version__} | {what} | threads {threads}"


def _cached(cache_dir, key: str, measure) -> float:
    """The value stored under key in cache_dir/CACHE_FILE, else measure() and store it (atomic write)."""
    path = Path(cache_dir).expanduser() / CACHE_FILE
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    if key in table:
        return float(table[key])
    load = LoadSampler()
    load.start()
    value = float(measure())
    busy = load.mean()
    if busy is not None and busy > MAX_OUTSIDE_LOAD:
        log.warning(
            "%s measured while other processes used %.0f%% of the cores: used for this run only, not cached "
            "(MFU against it reads high)",
            key,
            100 * busy,
        )
        return value
    table[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, table, sort_keys=True)
    return value


def cached_peak(device: str, dtype: torch.dtype, cache_dir) -> float:
    """Matmul peak FLOP/s for (machine, torch version, dtype, thread count), measured once and cached."""
    dtype_name = str(dtype).replace("torch.", "")
    return _cached(cache_dir, _cache_key(device, f"matmul {dtype_name}"), lambda: measure_matmul_peak(dtype, device))


def forget_peak(device: str, dtype: torch.dtype, cache_dir) -> bool:
    """Drop the cached matmul peak for this dtype (a run beat it: it was measured on a busy machine); True if dropped."""
    path = Path(cache_dir).expanduser() / CACHE_FILE
    key = _cache_key(device, f"matmul {str(dtype).replace('torch.', '')}")
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if table.pop(key, None) is None:
        return False
    write_json_atomic(path, table, sort_keys=True)
    return True


def cached_bandwidth(device: str, cache_dir) -> float:
    """Copy bandwidth in bytes/s for (machine, torch version, thread count), measured once and cached."""
    return _cached(cache_dir, _cache_key(device, "copy bandwidth"), lambda: measure_bandwidth(device))
