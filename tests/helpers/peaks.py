"""The CPU matmul peaks a test worker's training runs read from its GPTLAB_CACHE, measured once per worker."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

_WARM: dict[Path, Path] = {}  # cache folder -> its peaks file, measured by this process


def warm_peaks(cache: Path) -> Path | None:
    """Measure the CPU matmul peaks a training run asks for (hardware.peak_flops=auto: its dtype and thread count)
    into `cache`, a GPTLAB_CACHE folder, once per folder in this process; returns the peaks file (None when off).

    gptlab stores a measured peak only while other processes leave the cores quiet (gptlab/runtime/peak.py), which
    they never do under two test workers, so every such run measured it again (~1 s a run). The values come from
    the product's own measurement, taken while the other worker may be busy, as on a user's busy machine; a run
    that beats one drops it and measures again (peak.forget_peak). The peak tests use their own cache folders.
    GPTLAB_TEST_WARM_PEAKS=0 turns this off (docs/DEVELOPMENT.md, "Measured peaks and bytecode caches")."""
    if os.environ.get("GPTLAB_TEST_WARM_PEAKS") == "0":
        return None
    if cache in _WARM:
        return _WARM[cache]
    import torch

    from gptlab.runtime import peak
    from gptlab.runtime.hardware import cpu_has_bf16

    threads = torch.get_num_threads()
    try:
        for count in sorted({1, len(os.sched_getaffinity(0))}):
            torch.set_num_threads(count)  # the cache key names the thread count the run measures with
            for dtype in (torch.float32, *([torch.bfloat16] if cpu_has_bf16() else [])):
                key = peak._cache_key("cpu", f"matmul {str(dtype).removeprefix('torch.')}")
                peak._store(cache / peak.CACHE_FILE, key, peak.measure_matmul_peak(dtype, "cpu"))
    finally:
        torch.set_num_threads(threads)
    _WARM[cache] = cache / peak.CACHE_FILE
    return _WARM[cache]


def seeded_bench_work(work: Path, tmp_path_factory) -> Path:
    """`work`, a benchmark's --work folder, whose private gptlab cache (benchmarks/common.py hermetic_env) starts
    with this worker's matmul peaks: on a quiet machine the benchmark's first run measures and caches them; with the
    other worker busy, every run would measure them again."""
    peaks = warm_peaks(tmp_path_factory.getbasetemp() / "env" / "gptlab-cache")  # tests/conftest.py's GPTLAB_CACHE
    if peaks is not None:
        (work / "gptlab-cache").mkdir(parents=True, exist_ok=True)
        shutil.copy(peaks, work / "gptlab-cache" / peaks.name)
    return work
