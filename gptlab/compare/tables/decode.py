"""Decode columns: gptlab-decode's figures (decode.json) per group and (batch, context, cache) point.

The training-speed rules: each figure is mean ± std, here over the timed repeats of every run of the group
(seeds pooled); decode tokens/s and p50 per-token latency get a speed-up vs the baseline's same point, the ratio
of geometric means with a 95% CI and a verdict from Welch's t-test on the logs (faster / slower / within noise;
within noise by definition for two arms that build one model); taken under outside load, the verdict says so.

Runs are the unit of the test, as for training speed: one value per run (the geometric mean of its repeats), since
repeats in one process share its allocator and clocks and miss the run-to-run spread. With one run on a side the
test falls back to the repeats of that process, and the verdict carries Caveat.ONE_PROCESS.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gptlab.compare.reading.group import Group, assign_labels, diff_items, find_baseline, group_runs
from gptlab.compare.reading.identical import model_only
from gptlab.compare.reading.runs import Run
from gptlab.compare.statistics import speed, stats, verdict
from gptlab.compare.statistics.verdict import Caveat, Verdict


@dataclass
class DecodeRow:
    """One group's figures at one point (comparison.json `decode`)."""

    label: str
    batch: int
    context: int
    cache: str
    status: str
    reason: str | None = None
    n_runs: int = 0
    tokens_per_s: list[float] = field(default_factory=list)
    latency_p50_ms: list[float] = field(default_factory=list)
    latency_p99_ms: list[float] = field(default_factory=list)
    prefill_ms: list[float] = field(default_factory=list)
    run_tokens_per_s: list[float] = field(default_factory=list)  # one per measured run: its repeats' geometric mean
    run_latency_p50_ms: list[float] = field(default_factory=list)  # the same for p50 latency
    kv_bytes_measured: int | None = None
    kv_bytes_predicted: int | None = None
    kv_bytes_ratio: float | None = None
    peak_mem_delta_bytes: float | None = None
    speedup: Verdict | None = None  # tokens/s vs the baseline's same point
    latency_speedup: Verdict | None = None  # the same for p50 latency (baseline / this)
    outside_load: float | None = None


def decode_only(runs: list[Run]) -> bool:
    """True when every run is a gptlab-decode measurement without training records."""
    return all(r.decode and not r.val_steps() for r in runs)


def _key(p: dict) -> tuple[int, int, str]:
    return int(p["batch"]), int(p["context"]), str(p["cache"])


def _run_value(repeats: list[float]) -> list[float]:
    """[geometric mean of one run's repeats], or [] when it timed none."""
    value = speed.geometric(repeats)[0]
    return [] if value is None else [value]


def _row(label: str, points: list[dict], loads: list[float]) -> DecodeRow:
    """A group's row at one point from its runs' point dicts (repeats pooled over runs, and one value per run)."""
    done = [p for p in points if p.get("status") == "measured"]
    first = (done or points)[0]
    row = DecodeRow(
        label,
        *_key(first),
        status="measured" if done else "skipped",
        reason=first.get("reason"),
        n_runs=len(done),
        outside_load=max(loads, default=None),
    )
    for p in done:
        row.tokens_per_s += p["decode_tokens_per_s"]["values"]
        row.latency_p50_ms += p["latency_ms_p50"]["values"]
        row.latency_p99_ms += p["latency_ms_p99"]["values"]
        row.prefill_ms += p["prefill_ms"]["values"]
        row.run_tokens_per_s += _run_value(p["decode_tokens_per_s"]["values"])
        row.run_latency_p50_ms += _run_value(p["latency_ms_p50"]["values"])
    if done:
        row.kv_bytes_measured, row.kv_bytes_predicted = first["kv_bytes_measured"], first["kv_bytes_predicted"]
        row.kv_bytes_ratio = first["kv_bytes_ratio"]
        row.peak_mem_delta_bytes = max(p["peak_mem_delta_bytes"]["mean"] for p in done)
    return row


def _fingerprint(g: Group) -> str | None:
    prints = {(r.decode.get("model") or {}).get("fingerprint") for r in g.runs}
    return prints.pop() if len(prints) == 1 else None


def _identical(g: Group, base: Group) -> bool:
    fp = _fingerprint(g)
    return (
        g is not base
        and fp is not None
        and fp == _fingerprint(base)
        and model_only(k for k, _ in diff_items(g, base, hide_implied=False))
    )


def _versus(metric: str, values: str, arm: DecodeRow, base: DecodeRow, identical: bool, loaded: bool) -> Verdict:
    """arm / base on the row field `values`: tested on one value per run (`run_<values>`) when both sides have 2+
    runs; else on the repeats of one process, flagged ONE_PROCESS (they miss the run-to-run spread)."""
    one_process = min(len(getattr(arm, f"run_{values}")), len(getattr(base, f"run_{values}"))) < 2
    unit = values if one_process else f"run_{values}"
    found = verdict.ratio(metric, getattr(arm, unit), getattr(base, unit), stats.ALPHA, identical=identical)
    found = found.with_caveat(Caveat.ONE_PROCESS) if one_process else found
    return found.with_caveat(Caveat.UNDER_LOAD) if loaded else found


def _loaded(row: DecodeRow | None) -> bool:
    return row is not None and row.outside_load is not None and row.outside_load > speed.OUTSIDE_LOAD_LIMIT


def decode_rows(groups: list[Group]) -> list[DecodeRow]:
    """Rows per group (the baseline, groups[0], first) and point, with speed-ups vs the baseline's same point."""
    out, base_rows = [], {}  # type: list[DecodeRow], dict
    for g in groups:
        by_point: dict[tuple, list[dict]] = {}
        for run in g.runs:
            for p in run.decode.get("points") or []:
                by_point.setdefault(_key(p), []).append(p)
        loads = [float(r.decode["outside_load"]) for r in g.runs if r.decode.get("outside_load") is not None]
        same = _identical(g, groups[0])
        for key, points in by_point.items():
            row = _row(g.label, points, loads)
            base = base_rows.setdefault(key, row) if g is groups[0] else base_rows.get(key)
            if row.status == "measured" and base is not None and base.status == "measured":
                loaded = _loaded(row) or _loaded(base)
                if g is groups[0]:
                    row.speedup = verdict.baseline("decode_tokens_per_s", ratio=True)
                    row.latency_speedup = verdict.baseline("latency_ms_p50", ratio=True)
                else:
                    row.speedup = _versus("decode_tokens_per_s", "tokens_per_s", row, base, same, loaded)
                    # lower latency is faster: baseline / this
                    row.latency_speedup = _versus("latency_ms_p50", "latency_p50_ms", base, row, same, loaded)
            out.append(row)
    return out


def compare_decode(runs: list[Run], baseline: str | None) -> tuple[str, list[DecodeRow]]:
    """(baseline label, rows) for gptlab-decode run dirs alone (no training records to line up)."""
    groups = group_runs(runs)
    base = find_baseline(groups, baseline)
    assign_labels(groups, base)
    return base.label, decode_rows([base] + [g for g in groups if g is not base])


def to_json(rows: list[DecodeRow]) -> list[dict[str, Any]]:
    """comparison.json's `decode` list: each row with its mean/std next to the pooled values."""
    out = []
    for r in rows:
        d = asdict(r)
        d["speedup"] = r.speedup.to_json() if r.speedup else None
        d["latency_speedup"] = r.latency_speedup.to_json() if r.latency_speedup else None
        for key in ("tokens_per_s", "latency_p50_ms", "latency_p99_ms", "prefill_ms"):
            values = d[key]
            d[f"{key}_mean"] = stats.mean(values) if values else None
            d[f"{key}_std"] = stats.std(values) if values else None
        out.append(d)
    return out
