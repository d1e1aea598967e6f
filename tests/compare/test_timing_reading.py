"""A timing session read back by compare (gptlab/compare/reading/timing.py) and its verdicts
(gptlab/compare/statistics/timed.py), on synthetic timing.json files beside synthetic run dirs: the figures come from
the session alone, a damaged file is one line, and timed arms are matched to compare's groups or said not to be."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from gptlab.compare.reading.group import group_runs
from gptlab.compare.reading.runs import load_run
from gptlab.compare.reading.timing import FIX, find_timings, match, notes, read_timing
from gptlab.compare.statistics.rounds import round_rates, second, session_speeds
from gptlab.compare.statistics.speed import OUTSIDE_LOAD_LIMIT
from gptlab.compare.statistics.timed import group_speeds, rebased, speeds
from gptlab.compare.statistics.verdict import Caveat, Status
from gptlab.errors import ConfigError
from gptlab.sweep.layout import SWEEP_FILE, TIMING_FILE
from helpers.compare import write_run

PEAK = 1e11
SETTINGS = {"batch_size": 4, "seq_len": 32, "grad_accum": 1, "device": "cpu", "dtype": "fp32", "compile": False}
# per arm: the rate (tokens/s) of its windows in each of 3 rounds; the baseline's second windows are "base#2"
RATES = {
    "base": [1000.0, 900.0, 1100.0],
    "base#2": [1010.0, 880.0, 1120.0],
    "fast": [1500.0, 1400.0, 1600.0],
    "twin": [1005.0, 890.0, 1090.0],
}


def arm_record(run_dir: Path, fingerprint: str, flops: float = 7.2e5, **settings) -> dict:
    return {"run_dir": str(run_dir), "model_fingerprint": fingerprint, "params": 1000, "flops_per_token": flops,
            "run_peak_flops": 1e12, "tokens_per_step": 128, "prefetch": 0, "threads": 2,
            **SETTINGS, **settings}  # fmt: skip


def window(r: int, position: int, label: str, rate: float, load: float | None = 0.0) -> dict:
    arm, repeat = (label.removesuffix("#2"), 1) if label.endswith("#2") else (label, 0)
    step_ms = 128 / rate * 1000
    return {"round": r, "position": position, "arm": arm, "repeat": repeat, "built": False, "warmup_ms": [1.0],
            "step_ms": [step_ms], "step_ms_median": step_ms, "tokens_per_s": rate, "outside_load": load,
            "loadavg_before": None, "loadavg_after": None, "threads": 2, "started_at": 0.0, "ended_at": 1.0}  # fmt: skip


def timing_doc(arms: dict[str, dict], rates: dict[str, list[float]], loads: dict[str, float] | None = None) -> dict:
    """A finished session over `arms` (baseline first) with the given per-round rates."""
    labels = [*arms, f"{next(iter(arms))}#2"]
    rounds = len(next(iter(rates.values())))
    windows = [window(r, i, label, rates[label][r], (loads or {}).get(label, 0.0))
               for r in range(rounds) for i, label in enumerate(labels)]  # fmt: skip
    return {
        "version": 1,
        "plan": {
            "arms": [{"name": n, "run_dir": a["run_dir"]} for n, a in arms.items()],
            "rounds": rounds,
            "steps": 30,
            "warmup": 5,
            "seed": 0,
        },  # fmt: skip
        "baseline": next(iter(arms)),
        "orders": [],
        "machine": {
            "hostname": "box",
            "cpu": "Some CPU",
            "gpu": None,
            "torch": "2.x",
            "machine_cores": 2,
            "cores": 2,
            "platform": "linux",
        },  # fmt: skip
        "peak": {"flops": PEAK, "device": "cpu", "dtype": "fp32", "threads": 2, "outside_load": 0.0},
        "memory": None,
        "arms": arms,
        "windows": windows,
        "status": "finished",
    }


@pytest.fixture
def sweep(tmp_path) -> tuple[Path, dict]:
    """A sweep dir: base (seeds 0, 1), fast (seeds 0, 1; another model), twin (seed 0; the base's model), and its
    timing.json timing base/seed0, fast/seed0 and twin/seed0."""
    root = tmp_path / "sw"
    root.mkdir()
    (root / SWEEP_FILE).write_text("arms: {base: [], fast: [], twin: []}\nseeds: [0, 1]\n")
    for seed in (0, 1):
        write_run(root / "base" / f"seed{seed}", seed=seed, fingerprint="aaaa")
        write_run(root / "fast" / f"seed{seed}", seed=seed, fingerprint="bbbb", choices={"mlp": "relu2"})
    write_run(root / "twin" / "seed0", seed=0, fingerprint="aaaa", choices={"norm": "rmsnorm"})
    arms = {name: arm_record((root / name / "seed0").resolve(), fp)
            for name, fp in (("base", "aaaa"), ("fast", "bbbb"), ("twin", "aaaa"))}  # fmt: skip
    doc = timing_doc(arms, RATES)
    (root / TIMING_FILE).write_text(json.dumps(doc))
    return root, doc


def groups_of(*dirs: Path):
    return group_runs([load_run(d.resolve()) for d in dirs])


def test_the_figures_are_the_sessions_own(sweep):
    root, _ = sweep
    session = read_timing(root / TIMING_FILE)
    assert session is not None and session.baseline == "base" and list(session.arms) == ["base", "fast", "twin"]
    base = session.arms["base"]
    # the baseline's step time is the median over all its windows, A/A windows included
    ms = statistics.median(128 / r * 1000 for r in RATES["base"] + RATES["base#2"])
    assert base.step_ms == pytest.approx(ms) and base.tokens_per_s == pytest.approx(128 / (ms / 1000))
    assert base.mfu == pytest.approx(7.2e5 * base.tokens_per_s / PEAK)
    assert base.seconds(1000) == pytest.approx(1000 * ms / 1000) and base.windows == 6
    fast = session.arms["fast"]
    assert fast.tokens_per_s == pytest.approx(1500.0) and fast.settings["batch_size"] == 4
    src = session.source
    assert (src.rounds, src.planned, src.steps, src.warmup, src.machine, src.hostname, src.finished) == (
        3, 3, 30, 5, "Some CPU", "box", True)  # fmt: skip


def test_a_missing_file_reads_as_none_and_a_given_path_that_holds_none_is_refused(tmp_path):
    assert read_timing(tmp_path / TIMING_FILE) is None
    with pytest.raises(ConfigError, match=f"--timing {tmp_path}: no {TIMING_FILE} there"):
        find_timings([], tmp_path)


def _break(doc: dict, how: str) -> object:
    if how == "not json":
        return "{"
    if how == "version":
        doc["version"] = 2
    elif how == "negative rate":
        doc["windows"][1]["tokens_per_s"] = -5.0
    elif how == "edited rate":
        doc["windows"][1]["tokens_per_s"] *= 2
    elif how == "unknown arm":
        doc["windows"][0]["arm"] = "ghost"
    elif how == "twice":
        doc["windows"][1]["position"] = doc["windows"][0]["position"]
    elif how == "no peak":
        doc["peak"] = {"flops": None}
    elif how == "repeat of another arm":
        doc["windows"][1]["repeat"] = 1
    elif how == "nan load":
        return json.dumps(doc).replace('"outside_load": 0.0', '"outside_load": NaN', 1)
    elif how == "arm record":
        doc["arms"]["fast"]["tokens_per_step"] = "128"
    return json.dumps(doc)


@pytest.mark.parametrize(
    "how",
    [
        "not json",
        "version",
        "negative rate",
        "edited rate",
        "unknown arm",
        "twice",
        "no peak",
        "repeat of another arm",
        "nan load",
        "arm record",
    ],  # fmt: skip
)
def test_a_damaged_timing_is_refused_in_one_line_naming_the_file(sweep, how):
    root, doc = sweep
    path = root / TIMING_FILE
    path.write_text(str(_break(json.loads(json.dumps(doc)), how)))
    with pytest.raises(ConfigError) as err:
        read_timing(path)
    text = str(err.value)
    assert text.startswith(f"{path}: ") and "\n" not in text and text.endswith(FIX)
    run = load_run((root / "base" / "seed0").resolve())
    with pytest.raises(ConfigError, match="damaged or hand-edited"):  # finding it reads it: never silently dropped
        find_timings([run])


def test_a_sweeps_runs_find_its_timing_and_other_runs_none(sweep, tmp_path):
    root, _ = sweep
    runs = [load_run((root / "fast" / "seed1").resolve()), load_run(write_run(tmp_path / "alone").resolve())]
    found = find_timings(runs)
    assert [s.path for s in found] == [root / TIMING_FILE]
    assert find_timings(runs[1:]) == []
    assert [s.path for s in find_timings([], root)] == [root / TIMING_FILE]


def test_groups_are_matched_by_run_dir_then_by_build(sweep):
    root, _ = sweep
    session = read_timing(root / TIMING_FILE)
    groups = groups_of(*(root / a / f"seed{s}" for a in ("base", "fast") for s in (0, 1)), root / "twin" / "seed0")
    found = match(session, groups)
    assert [(g.runs[0].path.parent.name, a.name) for g, a in found.timed] == [
        ("base", "base"), ("fast", "fast"), ("twin", "twin")]  # fmt: skip
    assert found.untimed == [] and found.unmatched == [] and found.mismatched == [] and notes(found) == []
    # a group none of whose runs was timed is matched by its model and speed settings
    only_seed1 = groups_of(root / "base" / "seed1", root / "fast" / "seed1")
    found = match(session, only_seed1)
    assert [a.name for _, a in found.timed] == ["base", "fast"] and [a.name for a in found.unmatched] == ["twin"]
    assert [n.subject for n in notes(found)] == ["twin"] and notes(found)[0].is_warning


def test_a_timed_run_whose_group_builds_another_model_is_flagged_not_matched(sweep, tmp_path):
    root, doc = sweep
    # fast/seed1 retrained since with other code: the group's runs now record two models
    write_run(root / "fast" / "seed1", seed=1, fingerprint="cccc", choices={"mlp": "relu2"})
    session = read_timing(root / TIMING_FILE)
    found = match(session, groups_of(root / "fast" / "seed0", root / "fast" / "seed1"))
    assert found.timed == [] and len(found.untimed) == 1
    assert [(a.name, diff) for _, a, diff in found.mismatched] == [("fast", ["model_fingerprint"])]
    assert [a.name for a in found.unmatched] == ["base", "twin"]  # fast is said once, as mismatched
    said = notes(found)
    assert [n.subject for n in said] == [found.untimed[0].label, "base", "twin"]  # the group is said once
    assert all(n.is_warning for n in said) and "recorded another model_fingerprint" in said[0].text
    # a speed setting that differs is flagged the same way: a group trained at another batch size
    other = tmp_path / "big"
    write_run(other, seed=0, fingerprint="bbbb", choices={"mlp": "relu2"}, leaves={"train.batch_size": 8})
    found = match(session, groups_of(other))
    assert found.timed == [] and found.mismatched == [] and [a.name for a in found.unmatched] == list(session.arms)


def test_mfu_and_equal_time_are_the_same_whichever_runs_are_read(sweep):
    root, _ = sweep
    session = read_timing(root / TIMING_FILE)
    subsets = [
        [root / "fast" / "seed0"],
        [root / "fast" / "seed1"],
        [root / "fast" / "seed0", root / "fast" / "seed1", root / "base" / "seed1"],
    ]
    seen = set()
    for dirs in subsets:
        found = match(read_timing(root / TIMING_FILE), groups_of(*dirs))
        arm = next(a for _, a in found.timed if a.name == "fast")
        seen.add((arm.mfu, arm.seconds(500), arm.tokens_per_s))
    assert seen == {(session.arms["fast"].mfu, session.arms["fast"].seconds(500), session.arms["fast"].tokens_per_s)}


def test_speeds_are_the_round_statistics_of_the_session(sweep):
    root, _ = sweep
    session = read_timing(root / TIMING_FILE)
    found = speeds(session)
    direct = session_speeds(round_rates(session.windows), "base", identical={"twin"})
    assert found == direct and list(found) == ["fast", "twin"]
    assert found["twin"].verdict.status is Status.IDENTICAL  # the base's model with the base's settings
    fast = found["fast"].speedup
    assert fast is not None and fast.ratio == pytest.approx(
        math.exp(statistics.mean(math.log(f / math.sqrt(b * b2))
                                 for f, b, b2 in zip(RATES["fast"], RATES["base"], RATES["base#2"]))))  # fmt: skip


def test_a_baseline_other_than_the_sessions_pairs_each_round_and_keeps_the_sessions_aa(sweep):
    root, _ = sweep
    session = read_timing(root / TIMING_FILE)
    rates = round_rates(session.windows)
    moved = rebased(rates, "base", "fast")
    for row, new in zip(rates, moved):
        assert math.sqrt(new["fast"] * new[second("fast")]) == pytest.approx(row["fast"])
        assert new[second("fast")] / new["fast"] == pytest.approx(row["base#2"] / row["base"])
    found = speeds(session, "fast")
    assert list(found) == ["base", "twin"]
    ratios = [t / f for t, f in zip(RATES["twin"], RATES["fast"])]
    assert found["twin"].speedup.ratio == pytest.approx(math.exp(statistics.mean(map(math.log, ratios))))
    assert found["twin"].aa.ratio == pytest.approx(speeds(session)["fast"].aa.ratio)  # the session's own A/A
    assert found["twin"].verdict.status is not Status.IDENTICAL  # twin builds the base's model, not fast's


def test_windows_under_outside_load_caveat_the_arm_and_the_baselines_caveat_every_arm(sweep):
    root, doc = sweep
    path = root / TIMING_FILE
    arms = doc["arms"]
    path.write_text(json.dumps(timing_doc(arms, RATES, {"fast": OUTSIDE_LOAD_LIMIT + 0.1})))
    found = speeds(read_timing(path))
    assert Caveat.UNDER_LOAD in found["fast"].verdict.caveats
    assert Caveat.UNDER_LOAD not in found["twin"].verdict.caveats
    path.write_text(json.dumps(timing_doc(arms, RATES, {"base#2": OUTSIDE_LOAD_LIMIT + 0.1})))
    session = read_timing(path)
    assert session.arms["base"].outside_load == pytest.approx(OUTSIDE_LOAD_LIMIT + 0.1)
    assert all(Caveat.UNDER_LOAD in s.verdict.caveats for s in speeds(session).values())
    assert all(Caveat.UNDER_LOAD in s.verdict.caveats for s in speeds(session, "fast").values())


def test_group_speeds_hold_each_timed_group_against_the_baseline_groups_arm(sweep):
    root, _ = sweep
    session = read_timing(root / TIMING_FILE)
    groups = groups_of(root / "base" / "seed0", root / "base" / "seed1", root / "fast" / "seed0")
    found = match(session, groups)
    base = next(g for g, a in found.timed if a.name == "base")
    pairs = group_speeds(found, base)
    assert [(g.runs[0].path.parent.name, s.arm) for g, s in pairs] == [("fast", "fast")]
    assert pairs[0][1] == speeds(session)["fast"]
