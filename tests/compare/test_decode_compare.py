"""gptlab-compare's decode verdicts: runs (processes) are the unit of the test, not the timed repeats inside one;
one process per side falls back to its repeats and says so (Caveat.ONE_PROCESS)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gptlab.compare.reading.group import Group
from gptlab.compare.reading.runs import Run
from gptlab.compare.render import decode as render_decode
from gptlab.compare.render import words
from gptlab.compare.statistics import verdict
from gptlab.compare.statistics.verdict import Caveat, Status
from gptlab.compare.tables.decode import decode_rows, to_json


def _run(name: str, repeats: list[float]) -> Run:
    """A gptlab-decode run dir's reading: one measured point, `repeats` its timed tokens/s."""
    point = {
        "batch": 1, "context": 64, "cache": "static", "status": "measured",
        "decode_tokens_per_s": {"values": repeats}, "latency_ms_p50": {"values": [1000.0 / v for v in repeats]},
        "latency_ms_p99": {"values": [1100.0 / v for v in repeats]}, "prefill_ms": {"values": [3.0]},
        "kv_bytes_measured": 4096, "kv_bytes_predicted": 4096, "kv_bytes_ratio": 1.0,
        "peak_mem_delta_bytes": {"mean": 8192.0},
    }  # fmt: skip
    return Run(Path(name), [], {}, {}, [], {}, decode={"model": {"fingerprint": f"fp-{name}"}, "points": [point]})


def _group(label: str, levels: list[float], repeat_noise: list[list[float]]) -> Group:
    """One run per level, each timed as len(noise) repeats at level * (1 + noise)."""
    runs = [
        _run(f"{label}{i}", [lv * (1 + e) for e in noise]) for i, (lv, noise) in enumerate(zip(levels, repeat_noise))
    ]
    return Group(runs, {"arm": label}, {}, label=label)


def _tight(n_runs: int, n_repeats: int = 10) -> list[list[float]]:
    """Repeat noise of ±0.1% (one process's repeats barely move)."""
    return [[0.001 * ((i + r) % 3 - 1) for i in range(n_repeats)] for r in range(n_runs)]


def _speedup(base: Group, arm: Group) -> verdict.Verdict:
    rows = decode_rows([base, arm])
    assert rows[0].speedup is not None and rows[0].speedup.status is Status.BASELINE
    assert rows[1].speedup is not None
    return rows[1].speedup


def test_run_to_run_spread_is_in_the_test_not_only_the_repeats():
    """Same speed, ~2% run-to-run spread, 0.1% within a run: pooled repeats (30 vs 30) would call it 3% faster at
    p ~ 1e-9; one value per run (3 vs 3) leaves it within noise."""
    base = _group("base", [990.0, 1010.0, 970.0], _tight(3))
    arm = _group("arm", [1040.0, 1000.0, 1025.0], _tight(3))
    rows = decode_rows([base, arm])
    row = rows[1]
    up = row.speedup
    assert up is not None and up.status is Status.WITHIN_NOISE and up.seeds == (3, 3) and up.p is not None
    assert 0.05 < up.p < 0.3 and Caveat.ONE_PROCESS not in up.caveats
    assert up.effect is not None and abs(up.effect - 1.032) < 0.002  # the ratio itself is unchanged
    assert up.interval is not None and up.interval[0] < 1.0 < up.interval[1]
    lat = row.latency_speedup
    assert lat is not None and lat.status is Status.WITHIN_NOISE and lat.seeds == (3, 3)
    assert words.speed(up) == "within noise"
    assert len(row.tokens_per_s) == 30 and len(row.run_tokens_per_s) == 3  # the columns keep the pooled repeats
    first = arm.runs[0].decode["points"][0]["decode_tokens_per_s"]["values"]
    assert row.run_tokens_per_s[0] == pytest.approx(math.exp(np.mean(np.log(first))), rel=1e-12)
    doc = to_json(rows)[1]
    assert len(doc["run_tokens_per_s"]) == 3 and len(doc["run_latency_p50_ms"]) == 3 and doc["tokens_per_s_std"] > 0


def test_equal_speeds_are_called_different_at_about_alpha():
    """400 A/A trials (3 runs a side, 3% between runs, 0.1% within): false 'faster'/'slower' at about 5%."""
    rng = np.random.default_rng(0)
    trials, decided, seeds = 400, 0, set()
    for _ in range(trials):
        sides = []
        for label in ("base", "arm"):
            levels = list(1000.0 * np.exp(rng.normal(0.0, 0.03, 3)))
            sides.append(_group(label, levels, [list(rng.normal(0.0, 0.001, 10)) for _ in range(3)]))
        up = _speedup(*sides)
        decided, seeds = decided + up.decided, seeds | {up.seeds}
    assert decided / trials <= 0.08, f"false decisions {decided / trials:.3f}"  # 0.03 here; pooled repeats: 0.60
    assert seeds == {(3, 3)}


def test_a_true_speedup_is_still_decided_with_three_runs():
    base = _group("base", [1000.0, 1010.0, 990.0], _tight(3))
    arm = _group("arm", [1300.0, 1315.0, 1290.0], _tight(3))
    rows = decode_rows([base, arm])
    up, lat = rows[1].speedup, rows[1].latency_speedup
    assert up is not None and up.decided and up.direction == 1 and up.seeds == (3, 3) and up.p is not None
    assert up.p < 1e-3 and up.effect is not None and abs(up.effect - 1.302) < 0.005 and not up.caveats
    assert lat is not None and lat.decided and lat.direction == 1 and abs(lat.effect - up.effect) < 1e-9
    assert words.speed(up) == "faster"


def test_one_process_per_side_tests_its_repeats_and_says_so():
    base = _group("base", [1000.0], _tight(1))
    arm = _group("arm", [1100.0], _tight(1))
    rows = decode_rows([base, arm])
    up, lat = rows[1].speedup, rows[1].latency_speedup
    assert up is not None and up.decided and up.direction == 1 and up.seeds == (10, 10)  # from the repeats
    assert up.caveats == (Caveat.ONE_PROCESS,) and lat is not None and lat.caveats == (Caveat.ONE_PROCESS,)
    assert words.speed(up) == f"faster, {words.ONE_PROCESS}"
    assert words.ONE_PROCESS == "repeats of one process (run-to-run spread not measured)"
    assert words.speed(up, caveats=False) == "faster"
    doc = to_json(rows)[1]["speedup"]
    assert doc["caveats"] == ["one_process"] and verdict.from_json(doc) == up  # comparison.json round trip
    assert words.ONE_PROCESS in render_decode.cells(rows)[1][5]  # the table's speed-up cell
    assert rows[0].speedup is not None and words.speed(rows[0].speedup) == "baseline"  # the baseline: no caveat


def test_one_run_on_either_side_falls_back_to_repeats():
    """Two runs against one: the side with one process has no run-to-run spread, so both sides use repeats."""
    base = _group("base", [1000.0], _tight(1))
    arm = _group("arm", [1010.0, 990.0], _tight(2))
    up = _speedup(base, arm)
    assert up.seeds == (20, 10) and Caveat.ONE_PROCESS in up.caveats
