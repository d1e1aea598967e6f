"""Measured hardware roofs: matmul peak FLOP/s and copy bandwidth, cached per machine, torch version and dtype.

CPU: `cached_peak` / `cached_bandwidth`, keyed by the processor model and torch's thread count; a figure taken while
other processes used more than MAX_OUTSIDE_LOAD of the cores serves that run only. CUDA (a GPU the datasheet table of
gptlab.runtime.gpus lacks): `cached_gpu_peak`, keyed by the device name, dtype and, for fp32, the TF32 switch; a figure
is cached only when NVML says the GPU was idle before it was taken (busy, or no NVML to ask: that run only).
"""

from __future__ import annotations

import json
import logging
import math
import platform
import time
from pathlib import Path

import torch

from gptlab.runtime.cpu_load import LoadSampler
from gptlab.util.io import write_json_atomic

log = logging.getLogger(__name__)
# v2: values are cached only when measured on a quiet machine (v1 files could hold peaks taken under load,
# which made MFU look up to ~2x too high without tripping the > 100 % check). v3: timed through F.linear, the op a
# model's nn.Linear runs: a CPU without native bf16/fp16 runs torch.mm in them ~10x slower than F.linear's oneDNN
# path (1.2 against 16 GFLOP/s on a 2-core AVX2 EPYC), so v2's peaks there were ~10x low and MFU read 300-400 %
CACHE_FILE = "hardware_peaks_v3.json"
MAX_OUTSIDE_LOAD = 0.25  # share of all cores other processes may use while a peak is measured for the cache
MAX_GPU_BUSY = 0.10  # NVML utilisation (share of its sample period with kernels running) a quiet GPU may show
NVML_PERIOD_S = 1.0  # NVML averages utilisation over the last 1/6 s to 1 s, depending on the GPU


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a·bᵀ through F.linear, the op a model's nn.Linear runs (2·n³ FLOPs for n×n operands). On a CPU without native
    bf16 or fp16, torch.mm in them takes a ~10x slower path than F.linear's oneDNN one, and a peak timed that way is
    beaten by training itself; in fp32 the two run the same BLAS."""
    return torch.nn.functional.linear(a, b)


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


PROBE_N = 512  # the matmul timed first, to size the measured one
SLOW_CALL = 4.0  # a matmul estimated to take more than this many budgets is cut down to a third of one


def fitting_size(dtype: torch.dtype, device: str, n: int, call_s: float) -> int:
    """n, or where an n matmul would take far longer than call_s (emulated fp16 on a CPU runs ~10x slower than fp32
    even through F.linear; through torch.mm a 2048 one took minutes under load) the size (a multiple of 64,
    >= PROBE_N) that takes about a third of call_s by a timed PROBE_N one (a larger emulated matmul runs slower per
    FLOP than the probe)."""
    if n <= PROBE_N:
        return n
    a = torch.ones(PROBE_N, PROBE_N, device=device, dtype=dtype)
    seconds = max(_best_time(lambda: _product(a, a), device, repeats=3, budget_s=call_s), 1e-9)
    if seconds * (n / PROBE_N) ** 3 <= SLOW_CALL * call_s:  # time grows as n³
        return n
    return int(max(PROBE_N, PROBE_N * (call_s / 3 / seconds) ** (1 / 3) // 64 * 64))


def measure_matmul_peak(
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
    n: int = 2048,
    repeats: int = 8,
    budget_s: float = 1.5,
    fit: bool = True,
) -> float:
    """FLOP/s of the best of a few n×n matmuls in `dtype` on `device` (`_product`: 2·n³ FLOPs each); n is cut down
    where one would take longer than budget_s (`fitting_size`), unless fit=False (a caller that fitted n once)."""
    if fit:
        n = fitting_size(dtype, device, n, budget_s)
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    seconds = _best_time(lambda: _product(a, b), device, repeats, budget_s)
    return 2.0 * n**3 / seconds


def measure_gpu_matmul_peak(
    dtype: torch.dtype,
    device: str,
    tf32: bool,
    n: int = 8192,
    per_call: int = 4,
    repeats: int = 8,
    budget_s: float = 2.0,
) -> float:
    """FLOP/s of the best timed call of `per_call` (n×n)·(n×n) matmuls in `dtype` on a CUDA device (2·n³ FLOPs each).

    n = 8192 keeps tensor cores busy (a 2048 product is too short on a big GPU to beat the launch and sync cost),
    halved while the three operands would take over half of the memory free now (the model is already there);
    fp32 runs as hardware.tf32 says (TF32 tensor cores or IEEE fp32), the process-wide flag restored after. The
    operands come from their own generator, so the run's CUDA RNG stream is untouched; their memory is released.
    """
    free, _total = torch.cuda.mem_get_info(torch.device(device))
    while n > 1024 and 3 * n * n * dtype.itemsize > free // 2:
        n //= 2
    saved = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32" if tf32 else "ieee"
    try:
        seconds = _time_gpu_matmuls(dtype, device, n, per_call, repeats, budget_s)
    finally:
        torch.backends.cuda.matmul.fp32_precision = saved
        torch.cuda.empty_cache()  # the operands (freed on return) back to the driver, not held by the allocator
    return 2.0 * n**3 * per_call / seconds


def _time_gpu_matmuls(dtype: torch.dtype, device: str, n: int, per_call: int, repeats: int, budget_s: float) -> float:
    """Seconds of the fastest call of `per_call` (n×n)·(n×n) matmuls; the operands live only inside this call."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=gen, device=device, dtype=dtype)  # (n, n)
    b = torch.randn(n, n, generator=gen, device=device, dtype=dtype)  # (n, n)
    out = torch.empty(n, n, device=device, dtype=dtype)

    def calls() -> None:
        for _ in range(per_call):
            torch.mm(a, b, out=out)

    return _best_time(calls, device, repeats, budget_s)


def gpu_busy(device: str) -> float | None:
    """Share of NVML's last sample period in which some kernel ran on `device`, read after this process has been
    idle for a whole period (so its own kernels are not counted); None where NVML cannot be asked (no nvidia-ml-py
    installed, a MIG slice, a container without the library)."""
    torch.cuda.synchronize(device)
    time.sleep(NVML_PERIOD_S)
    try:
        return torch.cuda.utilization(device) / 100.0
    except Exception:  # ModuleNotFoundError without pynvml; pynvml's own NVMLError family otherwise
        return None


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


def _table(path: Path) -> dict:
    """The cache file's {key: value}; {} when it is missing, and {} with one warning when it is damaged (it is
    rewritten with the next measurement: a peak is re-measurable, never guessed)."""
    if not path.is_file():
        return {}
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        table = err
    if not isinstance(table, dict):
        why = type(table).__name__ if isinstance(table, Exception) else f"a JSON {type(table).__name__}, not a table"
        log.warning("%s is damaged (%s): the peaks it held are measured again and the file rewritten", path, why)
        return {}
    return table


def _usable(value) -> float | None:
    """A stored peak as FLOP/s: a finite number > 0, else None (a damaged or hand-edited entry)."""
    try:
        flops = float(value)
    except (TypeError, ValueError):
        return None
    return flops if math.isfinite(flops) and flops > 0 else None


def _store(path: Path, key: str, value: float) -> None:
    """Add one value to the cache file (re-read first: another run may have added its own since)."""
    table = _table(path)
    table[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, table, sort_keys=True)


def _cached(cache_dir, key: str, measure) -> float:
    """The value stored under key in cache_dir/CACHE_FILE, else measure() and store it (atomic write)."""
    path = Path(cache_dir).expanduser() / CACHE_FILE
    table = _table(path)
    if key in table:
        stored = _usable(table[key])
        if stored is not None:
            return stored
        log.warning("%s: the peak stored for '%s' is %r, not FLOP/s > 0: measured again", path, key, table[key])
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
    _store(path, key, value)
    return value


def cached_peak(device: str, dtype: torch.dtype, cache_dir) -> float:
    """Matmul peak FLOP/s for (machine, torch version, dtype, thread count), measured once and cached."""
    dtype_name = str(dtype).replace("torch.", "")
    return _cached(cache_dir, _cache_key(device, f"matmul {dtype_name}"), lambda: measure_matmul_peak(dtype, device))


def gpu_peak_key(device: str, dtype: torch.dtype, tf32: bool) -> str:
    """The cache key of a CUDA device's matmul peak: device name, torch version, dtype (and TF32 or IEEE for fp32)."""
    what = f"matmul {str(dtype).replace('torch.', '')}"
    if dtype == torch.float32:
        what += " tf32" if tf32 else " ieee"
    return _cache_key(device, what)


def cached_gpu_peak(device: str, dtype: torch.dtype, tf32: bool, cache_dir) -> tuple[float, str]:
    """(matmul peak FLOP/s of this CUDA device's model, where it came from in words) for a GPU without a datasheet
    entry: cached per device name, dtype and torch version, else measured now and cached only when NVML saw the GPU
    idle first (a busy GPU gives a low peak and an MFU that reads high). cache_dir None: measured, never cached."""
    key = gpu_peak_key(device, dtype, tf32)
    path = None if cache_dir is None else Path(cache_dir).expanduser() / CACHE_FILE
    if path is not None and (stored := _usable(_table(path).get(key))) is not None:
        return stored, f"cached in {path}"
    busy = gpu_busy(device)
    value = float(measure_gpu_matmul_peak(dtype, device, tf32))
    if path is None:
        return value, "measured now, not cached"
    if busy is None:
        return value, "measured now, not cached: without NVML (pip install nvidia-ml-py) the GPU's load is unknown"
    if busy > MAX_GPU_BUSY:
        return value, f"measured now while the GPU was {100 * busy:.0f}% busy: not cached"
    _store(path, key, value)
    return value, f"measured now, cached in {path}"


def forget_peak(device: str, dtype: torch.dtype, cache_dir, tf32: bool = True) -> bool:
    """Drop the cached matmul peak for this dtype (a run beat it: it was measured on a busy machine); True if dropped.

    CUDA: the measured peak of a GPU without a datasheet entry (gpu_peak_key; `tf32` picks the fp32 one); a GPU of
    the datasheet table has no cached peak, so nothing is dropped."""
    path = Path(cache_dir).expanduser() / CACHE_FILE
    if device.startswith("cuda"):
        key = gpu_peak_key(device, dtype, tf32)
    else:
        key = _cache_key(device, f"matmul {str(dtype).replace('torch.', '')}")
    table = _table(path)
    if table.pop(key, None) is None:
        return False
    write_json_atomic(path, table, sort_keys=True)
    return True


def cached_bandwidth(device: str, cache_dir) -> float:
    """Copy bandwidth in bytes/s for (machine, torch version, thread count), measured once and cached."""
    return _cached(cache_dir, _cache_key(device, "copy bandwidth"), lambda: measure_bandwidth(device))
