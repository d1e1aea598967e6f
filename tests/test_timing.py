"""The timing session (gptlab/train/timing.py): two tiny CPU arms trained for real, then timed in interleaved rounds."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gptlab.compare.statistics.rounds import round_rates, session_speeds
from gptlab.config.build import compose, plain_config
from gptlab.errors import ConfigError
from gptlab.train import timing
from gptlab.train.timing import TIMING_FILE, Arm, Plan, run_session
from helpers.train import FAST, TINY, run_inprocess

STEPS, ROUNDS, WARMUP = 2, 2, 1


def _train(run: Path, *overrides: str) -> dict:
    """A 2-step tiny run, with the .hydra/config.yaml gptlab-train would have saved beside it."""
    args = [*TINY, "train.prefetch=0", *overrides]
    summary = run_inprocess(run, *args, steps=2, eval_interval=2)
    cfg = compose([*FAST, "train.max_steps=2", "train.eval_interval=2", *args])
    (run / ".hydra").mkdir(exist_ok=True)
    OmegaConf.save(OmegaConf.create(plain_config(cfg)), run / ".hydra" / "config.yaml")
    return summary


@pytest.fixture(scope="module")
def arms(tmp_path_factory) -> tuple[Arm, Arm]:
    root = tmp_path_factory.mktemp("timing_runs")
    _train(root / "base")
    _train(root / "relu2", "mlp=relu2")
    return Arm("base", root / "base"), Arm("relu2", root / "relu2")


@pytest.fixture(scope="module")
def session(arms, tmp_path_factory) -> tuple[Plan, Path, dict]:
    plan = Plan(arms, rounds=ROUNDS, steps=STEPS, warmup=WARMUP, seed=7)
    folder = tmp_path_factory.mktemp("timing")
    return plan, folder, run_session(plan, folder)


def test_a_session_times_every_arm_and_the_baseline_twice_per_round(session):
    plan, folder, doc = session
    stored = json.loads((folder / TIMING_FILE).read_text())
    assert stored == json.loads(json.dumps(doc))  # what was returned is what was written, strict JSON
    windows = stored["windows"]
    assert len(windows) == ROUNDS * (len(plan.arms) + 1) == plan.windows()
    for r in range(ROUNDS):
        in_round = sorted((w["position"], w["arm"], w["repeat"]) for w in windows if w["round"] == r)
        # the order is the seed's shuffle, recomputed from (seed, round) alone
        assert [(arm, repeat) for _, arm, repeat in in_round] == plan.order(r)
        assert stored["orders"][r] == [list(w) for w in plan.order(r)]
        assert sorted((arm, repeat) for _, arm, repeat in in_round) == [("base", 0), ("base", 1), ("relu2", 0)]
    for w in windows:
        assert len(w["step_ms"]) == STEPS and len(w["warmup_ms"]) == WARMUP
        assert w["step_ms_median"] == pytest.approx(statistics.median(w["step_ms"]))
        tokens = stored["arms"][w["arm"]]["tokens_per_step"]
        assert w["tokens_per_s"] == pytest.approx(tokens / (w["step_ms_median"] / 1000))
        assert w["outside_load"] is None or 0.0 <= w["outside_load"] <= 1.0
    assert stored["status"] == "finished" and stored["baseline"] == "base"
    assert stored["peak"]["flops"] > 0 and stored["machine"]["cpu"] and stored["machine"]["torch"]
    # the document is what the round statistics read: every round pairs the arm with both baseline windows
    found = session_speeds(round_rates(stored["windows"]), "base")["relu2"]
    assert found.speedup.rounds == ROUNDS and found.aa.rounds == ROUNDS and found.speedup.ratio > 0


def test_the_shuffle_is_the_seeds_and_not_one_order():
    arms = tuple(Arm(f"a{i}", Path(f"/x/{i}")) for i in range(4))
    plan = Plan(arms, rounds=6, seed=3)
    assert [plan.order(r) for r in range(6)] == [Plan(arms, rounds=6, seed=3).order(r) for r in range(6)]
    assert len({tuple(plan.order(r)) for r in range(6)}) > 1  # rounds are not all in one order
    assert [plan.order(r) for r in range(6)] != [Plan(arms, rounds=6, seed=4).order(r) for r in range(6)]
    assert all(sorted(plan.order(r)) == sorted([(a.name, 0) for a in arms] + [("a0", 1)]) for r in range(6))


def test_each_arm_builds_the_model_its_run_trained(session, arms):
    _, _, doc = session
    for arm in arms:
        summary = json.loads((arm.run_dir / "summary.json").read_text())
        assert doc["arms"][arm.name]["model_fingerprint"] == summary["model_fingerprint"]
        assert doc["arms"][arm.name]["params"] == summary["params"]
        provenance = json.loads((arm.run_dir / "provenance.json").read_text())
        assert doc["arms"][arm.name]["threads"] == provenance["hardware"]["cpu_threads"]
        assert provenance["hardware"]["hostname"] == doc["machine"]["hostname"]  # the run's machine, by name
    assert doc["arms"]["base"]["model_fingerprint"] != doc["arms"]["relu2"]["model_fingerprint"]


def test_an_arm_whose_code_changed_since_training_is_refused(arms, tmp_path):
    import shutil

    run = tmp_path / "base"
    shutil.copytree(arms[0].run_dir, run)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "model_fingerprint": "0" * 16}))
    with pytest.raises(ConfigError, match="builds model .* but its run .* trained 0000000000000000"):
        run_session(Plan((Arm("base", run),), rounds=1, steps=1, warmup=1), tmp_path / "t")


def test_a_killed_session_times_only_its_missing_windows(arms, tmp_path, monkeypatch):
    plan = Plan(arms, rounds=ROUNDS, steps=STEPS, warmup=WARMUP, seed=11)
    seen: list[dict] = []

    def kill_after_two(record: dict) -> None:
        seen.append(record)
        if len(seen) == 2:
            raise KeyboardInterrupt  # the session dies after its second window was written

    with pytest.raises(KeyboardInterrupt):
        run_session(plan, tmp_path, on_window=kill_after_two)
    first = json.loads((tmp_path / TIMING_FILE).read_text())
    assert len(first["windows"]) == 2 and first["status"] == "running"
    peak = first["peak"]
    monkeypatch.setattr(timing, "measure_peak", lambda hardware: pytest.fail("the peak is measured once"))
    again: list[dict] = []
    doc = run_session(plan, tmp_path, on_window=again.append)
    assert len(again) == plan.windows() - 2
    assert {(w["round"], w["position"]) for w in again}.isdisjoint({(w["round"], w["position"]) for w in seen})
    assert doc["windows"][:2] == first["windows"]  # the windows timed before the kill are kept as they were
    assert doc["peak"] == peak and doc["status"] == "finished"
    assert len(doc["windows"]) == plan.windows()

    # a changed plan is refused in one line naming the file; more rounds only time the new rounds
    for changed in (Plan(arms, ROUNDS, STEPS + 1, WARMUP, 11), Plan(arms, ROUNDS - 1, STEPS, WARMUP, 11),
                    Plan(arms[:1], ROUNDS, STEPS, WARMUP, 11), Plan(arms, ROUNDS, STEPS, WARMUP, 12)):  # fmt: skip
        with pytest.raises(ConfigError, match=f"^{tmp_path / TIMING_FILE}: the session it records has other") as err:
            run_session(changed, tmp_path)
        assert "\n" not in str(err.value)
    grown: list[dict] = []
    doc = run_session(Plan(arms, ROUNDS + 1, STEPS, WARMUP, 11), tmp_path, on_window=grown.append)
    assert {w["round"] for w in grown} == {ROUNDS} and len(grown) == len(arms) + 1
    assert doc["plan"]["rounds"] == ROUNDS + 1 and len(doc["windows"]) == (ROUNDS + 1) * (len(arms) + 1)


def test_rebuilt_arms_warm_up_as_kept_ones(arms, tmp_path, monkeypatch):
    """Without room to keep every arm built, each window builds its arm, warms it up the same way and frees it."""
    monkeypatch.setattr(timing, "KEEP_SHARE", 0.0)
    plan = Plan(arms, rounds=1, steps=STEPS, warmup=WARMUP, seed=2)
    doc = run_session(plan, tmp_path)
    assert doc["memory"]["kept"] is False and doc["memory"]["need_bytes"] > 0
    assert all(w["built"] for w in doc["windows"])
    assert all(len(w["warmup_ms"]) == WARMUP and len(w["step_ms"]) == STEPS for w in doc["windows"])


def test_a_relaunch_on_another_machine_is_refused(session, monkeypatch):
    plan, folder, _ = session
    real = timing.machine_record
    monkeypatch.setattr(timing, "machine_record", lambda: {**real(), "hostname": "elsewhere"})
    with pytest.raises(ConfigError, match=f"^{folder / TIMING_FILE}: the session it records ran on another machine"):
        run_session(plan, folder)


def test_bad_plans_are_one_line():
    with pytest.raises(ConfigError, match="rounds=0; allowed: an integer >= 1"):
        Plan((Arm("a", Path(".")),), rounds=0)
    with pytest.raises(ConfigError, match="each name once"):
        Plan((Arm("a", Path(".")), Arm("a", Path("x"))))
