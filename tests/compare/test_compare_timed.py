"""Speed from the timing session (gptlab/compare/tables/timed.py): real tiny runs timed alone by `gptlab-compare RUNS
--time` (gptlab/study/timing.py) get the paired rounds' verdicts, their identical twin within noise, and MFU and equal
training time from the session; runs no session times get no speed verdict and the one command that times them; a
run's timed figures are the same whichever of a sweep's runs a report holds."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from gptlab.cli.compare import main
from gptlab.compare.reading.timing import read_timing
from gptlab.compare.statistics.rounds import round_rates, session_speeds
from gptlab.compare.statistics.speed import OUTSIDE_LOAD_LIMIT
from gptlab.config.build import compose, group_choices, plain_config
from gptlab.study import timing as study_timing
from gptlab.train.run import execute
from helpers.compare import speed_words, write_run, write_timing
from helpers.train import FAST, TINY

ROUNDS, STEPS, WARMUP = 3, 3, 1
# base; its twin (gqa with n_kv_head = n_head: mha's model, another config); relu2 (another model)
ARMS = {"base": [], "twin": ["attention=gqa", "attention.n_kv_head=2"], "relu2": ["mlp=relu2"]}
MAX_STEPS = 4


def _train(run_dir: Path, extra: list[str]) -> None:
    """One real run as gptlab-train writes it (its .hydra/config.yaml saved: what a timing session builds from)."""
    args = [*FAST, *TINY, "train.prefetch=0", f"train.max_steps={MAX_STEPS}", "train.eval_interval=2", *extra]
    cfg = compose(args)
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(plain_config(cfg)), run_dir / ".hydra" / "config.yaml")
    assert execute(cfg, run_dir, group_choices(cfg), args)["status"] == "finished"


def _compare(capsys, *args: str) -> tuple[dict, str, str]:
    rc = main([*map(str, args), "--no-wandb", "--noise-floor", "none"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-3000:]
    out = Path(args[args.index("--out") + 1])
    return json.loads((out / "comparison.json").read_text()), (out / "comparison.md").read_text(), captured.err


@pytest.fixture(scope="module")
def timed(tmp_path_factory):
    """Three real one-seed arms, compared with --time (the session kept small: 3 rounds of 1 + 3 steps)."""
    tmp = tmp_path_factory.mktemp("timed")
    dirs = [tmp / "runs" / arm for arm in ARMS]
    for run_dir, extra in zip(dirs, ARMS.values()):
        _train(run_dir, extra)
    out = tmp / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(study_timing, "ROUNDS", ROUNDS)
        mp.setattr(study_timing, "DEFAULT_STEPS", {"cpu": (STEPS, WARMUP), "cuda": (STEPS, WARMUP)})
        rc = main([*map(str, dirs), "--out", str(out), "--time", "--baseline", str(dirs[0]), "--no-wandb"])
    assert rc == 0
    return dirs, out, json.loads((out / "comparison.json").read_text())


def test_a_timed_report_takes_its_speed_verdicts_from_the_sessions_rounds(timed):
    dirs, out, doc = timed
    session = read_timing(out / "timing.json")
    assert session is not None and session.source.rounds == ROUNDS and session.source.finished
    assert doc["timing"]["path"] == str(out / "timing.json") and doc["timing"]["source"]["rounds"] == ROUNDS
    arms = session.arms
    base = arms[session.baseline]
    assert base.run_dir == dirs[0]
    # the rounds' own statistics (gptlab/compare/statistics/rounds.py), with the arms that build the baseline's model
    identical = {n for n, a in arms.items() if (a.fingerprint, a.settings) == (base.fingerprint, base.settings)}
    loaded = {n for n, a in arms.items() if a.outside_load is not None and a.outside_load > OUTSIDE_LOAD_LIMIT}
    loaded |= set(arms) if session.baseline in loaded else set()
    expected = session_speeds(round_rates(session.windows), session.baseline, identical=identical - {base.name},
                              loaded=loaded)  # fmt: skip
    rows = {r["timed_arm"]: r for r in doc["rows"]}
    assert set(rows) == set(arms) and rows[base.name]["speed"]["status"] == "baseline"
    for name, found in expected.items():
        row = rows[name]
        got = {**row["speed"], "mde": None}
        assert got == replace(found.verdict, mde=None).to_json(), name
        assert row["speedup"] == found.speedup.ratio and row["speed_aa"]["ratio"] == found.aa.ratio
    # an A/A-identical arm, timed: the twin builds the baseline's model, so it reads within noise
    twin = next(r for r in doc["rows"] if r["runs"] == [str(dirs[1])])
    assert twin["model_fingerprint"] == doc["rows"][0]["model_fingerprint"] and twin["timed_arm"] in identical
    assert twin["speed"]["status"] == "identical"  # (this shared machine may add "under outside load")
    assert speed_words(twin).startswith("within noise (identical model)")


def test_mfu_and_equal_training_time_come_from_the_session(timed, tmp_path, capsys):
    dirs, out, doc = timed
    session = read_timing(out / "timing.json")
    for row in doc["rows"]:
        arm = session.arms[row["timed_arm"]]
        assert row["mfu"] == pytest.approx(arm.flops_per_token * arm.tokens_per_s / session.peak_flops)
        assert (row["timed_tokens_per_s"], row["timed_step_ms"]) == (arm.tokens_per_s, arm.step_ms)
    time = doc["equal_compute"]["axes"][1]
    assert time["axis"] == "timed_s" and time["x"] == pytest.approx(
        min(a.seconds(MAX_STEPS) for a in session.arms.values())
    )
    # another report of two of the runs, given the session: the same figures for the runs it holds
    again, _, _ = _compare(capsys, dirs[0], dirs[2], "--out", tmp_path / "two", "--timing", out / "timing.json")
    for row in again["rows"]:
        same = next(r for r in doc["rows"] if r["timed_arm"] == row["timed_arm"])
        assert (row["mfu"], row["timed_tokens_per_s"]) == (same["mfu"], same["timed_tokens_per_s"])


def _sweep(root: Path) -> Path:
    """A sweep dir: base and fast, 2 seeds each; each arm's seed 0 trained packed beside another run (half its
    speed: its tokens/s, MFU and training time records say so). Timed alone: base 128 ms a step, fast 64 ms."""
    root.mkdir(parents=True)
    (root / "sweep.yaml").write_text(yaml.safe_dump({"arms": {"base": [], "fast": []}, "seeds": [0, 1]}))
    for arm, extra, ms in (("base", {}, 50.0), ("fast", {"choices": {"mlp": "relu2"}}, 25.0)):
        for seed in (0, 1):
            packed = 2.0 if seed == 0 else 1.0
            write_run(
                root / arm / f"seed{seed}", seed=seed, step_ms=ms * packed, tokens_per_s=128_000 / (ms * packed),
                mfu=0.02 / packed, fingerprint=f"fp-{arm}",
                loss_at=lambda step, s=seed, a=arm: 1.5 + 2.5 * math.exp(-step / 40.0) + 0.01 * s - 0.02 * (a == "fast"),
                **extra,
            )  # fmt: skip
    rates = {"base": [1000.0, 990.0, 1010.0], "base#2": [1004.0, 985.0, 1012.0], "fast": [2000.0, 1990.0, 2010.0]}
    write_timing(root, {arm: (root / arm / "seed1", f"fp-{arm}") for arm in ("base", "fast")}, rates)
    return root


def test_a_runs_equal_training_time_and_mfu_are_the_same_whichever_runs_a_report_holds(tmp_path, capsys):
    """Two reports of one timed sweep: all its runs, and each arm's packed seed 0 alone. The training records of the
    two sets differ (the packed seeds trained at half speed), the figures from the timing do not."""
    root = _sweep(tmp_path / "sweep")
    session = read_timing(root / "timing.json")
    every, _, _ = _compare(capsys, root, "--out", tmp_path / "all")
    packed, _, _ = _compare(capsys, root / "base" / "seed0", root / "fast" / "seed0", "--out", tmp_path / "seed0")
    for doc in (every, packed):
        assert [r["mfu"] for r in doc["rows"]] == pytest.approx(
            [7.2e5 * session.arms[a].tokens_per_s / 1e11 for a in ("base", "fast")]
        )
        time = doc["equal_compute"]["axes"][1]
        assert time["x"] == pytest.approx(session.arms["fast"].seconds(100))  # the time every run reached, timed
    assert every["rows"][0]["mfu_during_training"] != packed["rows"][0]["mfu_during_training"]  # the records moved
    assert [r["mfu"] for r in every["rows"]] == [r["mfu"] for r in packed["rows"]]
    # seed 0's own reading at equal training time is one number in both reports
    reading = [doc["equal_compute"]["axes"][1]["arms"][1]["losses"][0] for doc in (every, packed)]
    assert reading[0] == reading[1]
    assert [speed_words(r) for r in every["rows"]] == [speed_words(r) for r in packed["rows"]] == ["baseline", "faster"]


def test_untimed_runs_get_no_speed_verdict_and_the_command_that_times_them(tmp_path, capsys):
    root = _sweep(tmp_path / "sweep")
    (root / "timing.json").unlink()
    doc, md, err = _compare(capsys, root, "--out", tmp_path / "sweep_out")
    assert [speed_words(r) for r in doc["rows"]] == ["not timed", "not timed"] and doc["timing"] is None
    assert all(r["speedup"] is None and r["mfu"] is None for r in doc["rows"])
    assert doc["rows"][1]["tokens_per_s_gmean"] > doc["rows"][0]["tokens_per_s_gmean"]  # a record, not a verdict
    said = [n for n in doc["notes"] if n.startswith("note: speed not timed")]
    assert len(said) == 1 and said[0].endswith(f"gptlab-sweep time {root})") and said[0] in err
    assert "faster" not in md and "slower" not in md
    cells = doc["verdict_matrix"]["arms"][0]["cells"]
    assert cells["equal_training_time"]["status"] == "not_measured" and "| not timed |" in md
    # run dirs of no one sweep: compare's own --time times them
    loose = tmp_path / "loose"
    shutil.copytree(root / "base", loose / "base")
    shutil.copytree(root / "fast", loose / "fast")
    doc, _, _ = _compare(capsys, loose / "base", loose / "fast", "--out", tmp_path / "loose_out")
    [said] = [n for n in doc["notes"] if n.startswith("note: speed not timed")]
    assert said.endswith(f"gptlab-compare {loose / 'base'} {loose / 'fast'} --out {tmp_path / 'loose_out'} --time)")


def test_a_timing_path_that_holds_no_session_is_refused_in_one_line(tmp_path, capsys):
    root = _sweep(tmp_path / "sweep")
    assert main([str(root), "--out", str(tmp_path / "out"), "--no-wandb", "--timing", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"gptlab-compare: error: --timing {tmp_path}: no timing.json there; time the sweep first (gptlab-sweep time DIR)"
    )
