"""Measurements the loop reports: per-run peak memory, step times without a host sync, medians, and model FLOP
utilisation."""

from __future__ import annotations

import ctypes
import logging
import statistics
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)
PROC_STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int | None:
    """A `VmHWM:`-style field of /proc/self/status in KiB, or None where /proc is missing."""
    try:
        for line in PROC_STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


class PeakMemory:
    """The peak memory of ONE run: reset at its start, so nothing is carried over from an earlier run in the process.

    GPU: torch's peak allocated bytes since reset_peak_memory_stats. CPU: the resident-set high-water mark
    (VmHWM) after `clear_refs` resets it (Linux); where that is refused, the largest RSS sampled at each read.
    """

    def __init__(self, device: str):
        self.device = device
        self.sampled = 0
        self.hwm_reset = False
        self.reset()

    def reset(self) -> None:
        """Start counting from now (freed heap is first handed back to the OS so it does not count)."""
        if self.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
        try:
            CLEAR_REFS.write_text("5")  # 5 = reset the peak RSS to the current RSS (proc(5))
            self.hwm_reset = True
        except OSError as err:
            log.info("cannot reset the process peak RSS (%s); sampling RSS instead", err)
        self.sampled = (_status_kib("VmRSS") or 0) * 1024

    def read(self) -> int:
        """Peak bytes since reset()."""
        if self.device.startswith("cuda"):
            return int(torch.cuda.max_memory_allocated(self.device))
        rss = (_status_kib("VmRSS") or 0) * 1024
        self.sampled = max(self.sampled, rss)
        if self.hwm_reset:
            return max(self.sampled, (_status_kib("VmHWM") or 0) * 1024)
        return self.sampled


class StepClock:
    """Marks around each step, read in a batch at the loop's sync points: on CUDA, timing events recorded in the
    stream (a mark costs no host sync; the time between two marks is the GPU's, idle gaps while it waited for the
    CPU included); elsewhere perf_counter (a CPU op has finished when its call returns)."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def settle(self, last) -> None:
        """Wait until the mark `last` (and so every mark before it) has been reached: the one sync of a batch."""
        if self.cuda:
            last.synchronize()

    def seconds(self, start, end) -> float:
        """Seconds from mark `start` to mark `end` (settled)."""
        return start.elapsed_time(end) / 1000 if self.cuda else end - start


def sync(device: torch.device | str) -> None:
    """Wait for the work queued on `device` (a no-op off CUDA): a host clock read around GPU work times only the
    launches unless it is bracketed by this."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def mfu(flops_per_token: float, tokens_per_s: float, peak_flops: float | None, devices: int = 1) -> float | None:
    """Model FLOP utilisation: useful training FLOP/s per device over one device's peak."""
    if not peak_flops:
        return None
    return flops_per_token * tokens_per_s / devices / peak_flops
