"""One machine per comparison: the peak FLOP/s every training run's MFU record is put on, and runs taken on different
machines. (The table's MFU is the timing session's, against its one measured peak: compare/tables/timed.py.)

MFU = flops_per_token × tokens/s / devices / peak. Each run recorded the peak it used (summary.json `peak_flops`: a
datasheet figure, hardware.peak_flops, or a matmul probe of its machine), so two runs on one machine can carry
different probe values, and their MFUs then differ by the probes, not by the arms. A comparison uses ONE peak
(common_peak): --peak-flops when given, else the value most runs recorded (a tie goes to the larger, so that no
MFU is overstated). A run whose own peak differs has its MFU recomputed against the common one, MFU × own peak /
common peak (exact: every per-step MFU scales by that factor, so does their median), and is named in a warning. A
run that recorded an MFU but no peak cannot be put on the common peak: its MFU is left out, with a warning. When no
run recorded a peak (older runs), MFUs are shown as recorded and the report says that their peaks are unknown.

Runs whose provenance.json names different machines (GPU model, else CPU model) are named in a warning: their
tokens/s compare the machines as well as the arms.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gptlab.compare.reading.runs import Run
from gptlab.compare.statistics import speed, stats
from gptlab.util.note import Note, warning


@dataclass(frozen=True)
class Peak:
    """The comparison's one peak: flops (None: no run recorded one), source in words, and the runs whose MFU was
    recomputed (run dir -> its own peak) or left out (recorded an MFU without a peak)."""

    flops: float | None
    source: str
    recomputed: dict[Path, float] = field(default_factory=dict)
    dropped: list[Path] = field(default_factory=list)


def own_peak(run: Run) -> float | None:
    """The peak FLOP/s the run's MFU was computed against (summary.json `peak_flops`), if recorded."""
    value = run.summary.get("peak_flops")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return None
    return float(value)


def recorded_mfu(run: Run) -> float | None:
    """The MFU the run recorded (summary mfu_median, else the median of its metrics' mfu)."""
    return speed.run_speed(run, "mfu_median", "perf/mfu", stats.median)


def common_peak(runs: list[Run], given: float | None = None) -> Peak:
    """The one peak for these runs (see the module docstring)."""
    peaks = {r.path: own_peak(r) for r in runs}
    counts = Counter(p for p in peaks.values() if p is not None)
    if given is not None:
        flops, source = float(given), "--peak-flops"
    elif not counts:
        return Peak(None, "no run recorded its peak (older runs): each MFU is against its own run's peak")
    else:
        flops = max(counts, key=lambda p: (counts[p], p))
        n = counts[flops]
        source = "recorded by every run" if n == len(runs) else f"recorded by {n} of {len(runs)} runs"
    recomputed = {path: p for path, p in peaks.items() if p is not None and p != flops}
    dropped = [r.path for r in runs if peaks[r.path] is None and recorded_mfu(r) is not None]
    return Peak(flops, source, recomputed, dropped)


def run_mfu(run: Run, peak: Peak) -> float | None:
    """The run's MFU against the common peak (None when it has none, or recorded no peak to rescale from)."""
    mfu = recorded_mfu(run)
    if mfu is None or peak.flops is None:
        return mfu
    own = own_peak(run)
    return None if own is None else mfu * own / peak.flops


def _root(runs: list[Run]) -> str:
    return os.path.commonpath([str(r.path) for r in runs]) if len(runs) > 1 else str(runs[0].path.parent)


def _names(paths: list[Path], root: str, limit: int = 4) -> str:
    shown = [os.path.relpath(p, root) for p in paths[:limit]]
    return ", ".join(shown) + (", ..." if len(paths) > limit else "")


def peak_note(peak: Peak) -> str:
    """The report's line on the peak every MFU is against."""
    if peak.flops is None:
        return f"MFU during training (comparison.json mfu_during_training, a record): {peak.source}."
    return (
        "MFU during training (comparison.json mfu_during_training, a record): every run against one machine peak, "
        f"{peak.flops:.4g} FLOP/s ({peak.source})."
    )


def peak_warnings(runs: list[Run], peak: Peak) -> list[Note]:
    """One line for runs measured against other peaks (their MFU recomputed) and one for runs left out."""
    root, out = _root(runs), []
    if peak.recomputed:
        others = ", ".join(
            f"{p:.4g} in {_names([path for path, q in peak.recomputed.items() if q == p], root)}"
            for p in sorted(set(peak.recomputed.values()))
        )
        out.append(
            warning(
                f"MFU: runs were measured against different peaks ({others}; common {peak.flops:.4g} FLOP/s, "
                f"{peak.source}); their MFU is recomputed against the common peak as MFU × own peak / {peak.flops:.4g}",
                subject="MFU",
            )
        )
    if peak.dropped:
        out.append(
            warning(
                f"MFU of {_names(peak.dropped, root)} left out: an MFU without a recorded peak_flops cannot be put on "
                f"the common peak {peak.flops:.4g} FLOP/s",
                subject="MFU",
            )
        )
    return out


def machine_of(run: Run) -> str | None:
    """The machine a run trained on, from provenance.json: its GPU model, else its CPU model; None if unrecorded."""
    hardware = run.provenance.get("hardware")
    if not isinstance(hardware, dict):
        return None
    name = hardware.get("gpu") or hardware.get("cpu")
    return str(name) if name else None


def machine_warnings(runs: list[Run]) -> list[Note]:
    """One line when the runs' provenance names more than one machine."""
    by_machine: dict[str, list[Path]] = {}
    for run in runs:
        if (name := machine_of(run)) is not None:
            by_machine.setdefault(name, []).append(run.path)
    if len(by_machine) < 2:
        return []
    root = _root(runs)
    listed = "; ".join(
        f"{name} ({len(paths)} runs: {_names(paths, root, 2)})" for name, paths in sorted(by_machine.items())
    )
    return [
        warning(
            f"the runs trained on different machines ({listed}): their tokens/s and MFU during training compare the "
            "machines as well as the arms (a timing session times every arm on one machine)"
        )
    ]
