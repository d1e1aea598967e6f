"""Arm confounded with run order: an arm-major sweep under a load that falls while it runs makes a "speed-up" out of
the order in its training runs' tokens/s; compare names the confound on those records, which make no speed verdict
(only a timing session does, untouched by the order), and an interleaved launch of the same runs passes
(gptlab/compare/statistics/order.py, gptlab/sweep/plan.py `interleave`)."""

from __future__ import annotations

import json
import random

import pytest

from gptlab.cli.compare import main
from gptlab.compare.reading.runs import load_run
from gptlab.compare.statistics.order import confounded
from gptlab.sweep.plan import PlannedRun, interleave
from helpers.compare import write_run, write_timing

ARMS = ("mha", "mqa")


def _sweep(tmp_path, starts: dict[tuple[str, int], float], loads: dict | None = None):
    """2 arms x 3 seeds of one model config; a run's speed falls with the machine's load at its start time: the
    later it trained, the faster (load falling over the sweep), whatever its arm."""
    root = tmp_path / "sweep"
    for (arm, seed), t in starts.items():
        run = write_run(
            root / arm / f"seed{seed}", seed=seed, choices={"attention": arm}, tokens_per_s=1000.0 + 100.0 * t,
            outside_load=(loads or {}).get((arm, seed), 0.02), data_fingerprint="d",
        )  # fmt: skip
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**summary, "started_at": 1.8e9 + 60.0 * t}))
    return root


def _compare(root, tmp_path, capsys, *args: str):
    code = main([str(root), "--out", str(tmp_path / "out"), "--no-wandb", "--noise-floor", "none", *args])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads((tmp_path / "out" / "comparison.json").read_text()), captured


def test_an_arm_major_sweep_gets_no_speed_headline(tmp_path, capsys):
    arm_major = {(arm, s): float(i * 3 + s) for i, arm in enumerate(ARMS) for s in range(3)}
    root = _sweep(tmp_path, arm_major)
    doc, captured = _compare(root, tmp_path, capsys)
    base, mqa = doc["rows"]
    assert mqa["tokens_per_s_gmean"] / base["tokens_per_s_gmean"] > 1.2  # the order made a "speed-up" of the records
    assert mqa["order_confounded"] is True  # ... named on the records
    assert "tokens/s during training is confounded with run order: each arm's runs ran one after another" in (
        captured.err
    )
    # ... and no speed verdict is made of them: not timed
    assert mqa["speed"]["status"] == "not_measured" and mqa["speedup"] is None and mqa["speed"]["caveats"] == []
    said = [line for line in captured.out.splitlines() if line.startswith("attention=mqa, attention.n_kv_head=1:")]
    assert len(said) == 2  # the verdict matrix's sentence and the equal-steps one: neither headlines a speed
    for sentence in said:
        assert "speed not timed" in sentence and "faster" not in sentence
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "confounded with run order" in md and "| confounded" in md  # the flag column says it too
    time = doc["equal_compute"]["axes"][1]["arms"][1]["verdict"]
    assert time["status"] == "not_measured"  # equal training time comes from a timing session only
    # timed alone, the same arms get a speed verdict the run order cannot touch: the session's, no caveat
    rates = {"mha": [1000.0, 990.0, 1010.0], "mha#2": [1003.0, 992.0, 1006.0], "mqa": [1001.0, 989.0, 1012.0]}
    arms = {arm: (root / arm / "seed0", f"fp-{arm}") for arm in ARMS}
    timing = write_timing(tmp_path / "timing", arms, rates)
    doc, captured = _compare(root, tmp_path, capsys, "--timing", str(timing))
    mqa = doc["rows"][1]
    assert mqa["order_confounded"] is True and mqa["speed"]["status"] == "within_noise"
    assert mqa["speed"]["caveats"] == [] and mqa["speedup"] == pytest.approx(1.0, abs=0.01)


def test_the_same_runs_interleaved_pass(tmp_path, capsys):
    order = interleave([PlannedRun(arm, s, ()) for arm in ARMS for s in range(3)], "sweep")
    starts = {(r.arm, r.seed): float(i) for i, r in enumerate(order)}
    doc, captured = _compare(_sweep(tmp_path, starts), tmp_path, capsys)
    assert doc["rows"][1]["order_confounded"] is False and "confounded" not in captured.err


def test_runs_without_a_recorded_start_are_not_tested_and_the_report_says_so(tmp_path, capsys):
    runs = [load_run(write_run(tmp_path / arm / f"seed{s}", seed=s)) for arm in ARMS for s in range(2)]
    assert confounded([runs[:2], runs[2:]]) is None
    # an arm-major sweep in which one run lost its start time: the check cannot be made, and that is said (it was
    # skipped without a word, so the order-made "speed-up" of the records carried no caveat)
    arm_major = {(arm, s): float(i * 3 + s) for i, arm in enumerate(ARMS) for s in range(3)}
    root = _sweep(tmp_path / "x", arm_major)
    summary = root / "mqa" / "seed2" / "summary.json"
    summary.write_text(json.dumps({k: v for k, v in json.loads(summary.read_text()).items() if k != "started_at"}))
    doc, captured = _compare(root, tmp_path, capsys)
    (line,) = [w for w in captured.err.splitlines() if "recorded no start time" in w]
    assert line.startswith(f"warning: {root / 'mqa' / 'seed2'} recorded no start time (summary started_at")
    assert "whether run order or load made the training runs' tokens/s differ was not checked" in line
    assert doc["rows"][1]["speed"]["status"] == "not_measured"  # and no speed verdict is made of the records


def test_arm_explaining_the_load_is_a_confound(tmp_path):
    order = interleave([PlannedRun(arm, s, ()) for arm in ARMS for s in range(4)], "x")
    starts = {(r.arm, r.seed): float(i) for i, r in enumerate(order)}
    loads = {(arm, s): (0.01 if arm == "mha" else 0.2) + 0.001 * s for arm in ARMS for s in range(4)}
    root = _sweep(tmp_path, starts, loads)
    arms = [[load_run(root / arm / f"seed{s}") for s in range(4)] for arm in ARMS]
    assert confounded(arms).startswith("arm explains the outside load the runs saw (Kruskal-Wallis p=")


def test_interleaved_designs_are_never_flagged_and_arm_major_ones_always_are(tmp_path):
    """Over 300 random sweep names (3 or 4 arms x 3 to 5 seeds, start jitter): an interleaved launch order is flagged
    in no sweep (each seed's block holds every arm), an arm-major one in every sweep."""
    rng = random.Random(5)
    flagged_interleaved = flagged_major = 0
    for k in range(300):
        arms, seeds = [f"a{i}" for i in range(rng.choice((3, 4)))], range(rng.choice((3, 4, 5)))
        planned = [PlannedRun(a, s, ()) for a in arms for s in seeds]

        flagged_interleaved += confounded(_runs_in(interleave(planned, f"sweep{k}"), rng)) is not None
        flagged_major += confounded(_runs_in(planned, rng)) is not None
    assert flagged_interleaved == 0 and flagged_major == 300


def _runs_in(order: list[PlannedRun], rng: random.Random) -> list[list[_Fake]]:
    """Per arm (first-seen order) its runs, each started at its place in `order` plus a little jitter."""
    arms = list(dict.fromkeys(r.arm for r in order))
    return [[_Fake(i + rng.uniform(0, 0.5)) for i, r in enumerate(order) if r.arm == a] for a in arms]


class _Fake:
    """A run that recorded only when it started."""

    def __init__(self, t: float):
        self.summary = {"started_at": t}


def test_an_arm_run_after_all_the_others_is_confounded_against_the_baseline(tmp_path, capsys):
    """mha, mqa and gqa interleaved over seeds 0-2, then every run of a fourth arm: pooled over the four arms the
    order check passed, though the late arm against the baseline is arm-major. Each arm is now checked against the
    baseline too; the interleaved arms keep their verdicts."""
    order = ["mha", "mqa", "gqa", "gqa", "mha", "mqa", "mqa", "gqa", "mha", "sliding", "sliding", "sliding"]
    seen: dict[str, int] = {}
    starts = {}
    for t, arm in enumerate(order):
        starts[(arm, seen.setdefault(arm, 0))] = float(t)
        seen[arm] += 1
    doc, captured = _compare(_sweep(tmp_path, starts), tmp_path, capsys)
    flagged = {r["label"].split(",")[0]: r["order_confounded"] for r in doc["rows"][1:]}
    assert len(flagged) == 3 and flagged.pop("attention=sliding") is True and not any(flagged.values())
    assert all(r["speed"]["status"] == "not_measured" for r in doc["rows"][1:])  # records make no speed verdict
    assert (
        "warning: 'attention=sliding' tokens/s during training is confounded with run order against the baseline: "
        "each arm's runs ran one after another (arm-major order); no ratio of those records is a finding (speed "
        "verdicts come from a timing session only) (gptlab-sweep launches arms interleaved; rerun the runs that way)"
    ) in captured.err.splitlines()
    assert confounded([[load_run(tmp_path / "sweep" / a / f"seed{s}") for s in range(3)] for a in seen]) is None
