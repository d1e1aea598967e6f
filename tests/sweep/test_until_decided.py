"""gptlab-sweep --until-decided: seeds are added only to the arms still undecided, looks follow the group-sequential
plan (gptlab/compare/statistics/sequential.py), the looks are recorded and gptlab-compare reports them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gptlab.cli.compare import main as compare_main
from gptlab.cli.sweep import main as sweep_main
from gptlab.compare.statistics.sequential import plan
from gptlab.compare.studies.until_decided import RECORD_FILE, look, read_record, write_record
from helpers.cli import cli_env, run_cli
from helpers.compare import write_run

TINY = [
    "model.n_layer=1", "model.d_model=32", "model.n_head=4", "model.block_size=32", "train.batch_size=4",
    "train.eval_sequences=8", "sample.tokens=0", "logger=none", "hardware.dtype=fp32", "hardware.peak_flops=1e12",
    "train.max_steps=12", "train.eval_interval=12", "schedule.warmup_steps=0",
]  # fmt: skip


def _sweep_file(tmp_path: Path, arms: dict, seeds=(0, 1)) -> Path:
    path = tmp_path / "ud.yaml"
    path.write_text(yaml.safe_dump({"seeds": list(seeds), "overrides": TINY, "arms": arms}, sort_keys=False))
    return path


def _finals(root: Path, arm: str, finals: list[float]) -> None:
    for seed, final in enumerate(finals):
        write_run(root / arm / f"seed{seed}", seed=seed, loss_at=lambda step, f=final: f + 0.001 * (100 - step))


def test_a_look_decides_the_clear_arm_and_keeps_the_close_one_open(tmp_path, capsys):
    root = tmp_path / "sweep"
    _finals(root, "base", [2.00, 2.01, 1.99])
    _finals(root, "worse", [2.30, 2.31, 2.29])  # far above the noise: decided at the first look
    _finals(root, "close", [2.00, 2.02, 1.98])  # the same within noise: undecided
    design = plan(3, 1, 5)
    found = look(root, design, 0, "base", ["worse", "close"], [0, 1, 2])
    assert found["worse"].decided and found["worse"].direction == 1 and not found["close"].decided
    assert found["worse"].threshold == design.thresholds[0] < 0.05  # O'Brien-Fleming spends little at the first look
    write_record(root, design, "base", [found])
    doc = read_record(root)
    assert doc["baseline"] == "base" and doc["plan"]["seeds"] == [3, 4, 5] and len(doc["looks"]) == 1
    assert compare_main([str(root), "--out", str(tmp_path / "out"), "--no-wandb", "--noise-floor", "none"]) == 0
    note = next(n for n in json.loads((tmp_path / "out" / "comparison.json").read_text())["notes"] if "until" in n)
    assert note.startswith("note: seeds were added until decided: 1 of up to 3 looks taken")
    assert "'worse' at look 1, decided: val loss higher than 'base'" in note and "more seeds" in note


@pytest.mark.parametrize(
    "args, words",
    [
        (["--max-seeds", "4"], "--max-seeds needs --until-decided"),
        (["--seed-step", "2"], "--seed-step needs --until-decided"),
        (["--spending", "pocock"], "--spending needs --until-decided"),
        (["--until-decided"], "--until-decided needs --max-seeds N"),
        (["--until-decided", "--max-seeds", "4", "--lr-grid", "1e-3,1e-2"], "--until-decided: a plain arms x seeds"),
        (["--until-decided", "--max-seeds", "1"], "max_seeds"),
    ],
)
def test_bad_until_decided_flags_are_one_line_refusals(tmp_path, args, words):
    path = _sweep_file(tmp_path, {"base": [], "b": ["attention=mqa"]})
    done = run_cli("gptlab.cli.sweep", str(path), "--out", str(tmp_path / "out"), *args)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and words in done.stderr, done.stderr
    assert not list((tmp_path / "out").glob("*/seed*"))  # nothing ran


@pytest.mark.slow  # 8 tiny real runs through the local queue (~1 min on 2 cores)
def test_seeds_are_added_only_to_the_undecided_arm(tmp_path):
    # 'same' differs from the baseline only in its name: identical losses per seed, never decided (p = 1);
    # 'slow' learns with a 1000x smaller lr: far worse, decided at the first look
    arms = {"base": [], "same": [], "slow": ["optimizer.lr=1e-6"]}
    path = _sweep_file(tmp_path, arms)
    out = tmp_path / "out"
    done = run_cli(
        "gptlab.cli.sweep", str(path), "--out", str(out), "--until-decided", "--max-seeds", "3",
        env=cli_env(OMP_NUM_THREADS="1"), timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "until decided: up to 2 looks at 2, 3 seeds per arm (O'Brien-Fleming spending" in done.stdout
    assert "look 1 (2 seeds): slow: decided: val loss higher than 'base'" in done.stdout
    assert "look 2 (3 seeds): same: undecided at the cap of 3 seeds" in done.stdout
    ran = sorted(p.relative_to(out).as_posix() for p in out.glob("*/seed*") if (p / "summary.json").is_file())
    assert ran == ["base/seed0", "base/seed1", "base/seed2", "same/seed0", "same/seed1", "same/seed2",
                   "slow/seed0", "slow/seed1"]  # fmt: skip  # no third seed for the decided arm
    doc = json.loads((out / RECORD_FILE).read_text())
    assert [sorted(taken) for taken in doc["looks"]] == [["same", "slow"], ["same"]]


@pytest.mark.parametrize(
    "args, differs",
    [
        (["--max-seeds", "6"], "--max-seeds 6 (recorded: 4)"),
        (["--max-seeds", "4", "--spending", "pocock"], "--spending pocock (recorded: obrien_fleming)"),
        (["--max-seeds", "4", "--seed-step", "2"], "--seed-step 2 (recorded: 1)"),
        (["--max-seeds", "4", "--seeds", "0,1,2"], "--seeds count 3 (recorded: 2)"),
    ],
)
def test_another_plan_over_a_recorded_one_is_refused(tmp_path, capsys, args, differs):
    # a second plan over the same runs replays looks: 0.068-0.072 false decisions in A/A while the report said 0.05
    path, out = _sweep_file(tmp_path, {"base": [], "b": ["mlp.ratio=2"]}), tmp_path / "out"
    out.mkdir()
    record = write_record(out, plan(2, 1, 4), "base", [])
    before = record.read_bytes()
    for dry in (["--dry-run"], []):  # nothing runs or is written either way
        with pytest.raises(SystemExit) as exit_:
            sweep_main([str(path), "--out", str(out), "--until-decided", *args, *dry])
        err = capsys.readouterr().err.strip()
        assert exit_.value.code == 2 and err == (
            f"error: gptlab-sweep: --until-decided: {record} records looks of another plan: {differs}; looks replayed "
            "under a second plan push the false-decision rate above alpha; allowed: the recorded plan (--seeds count "
            "2, --seed-step 1, --max-seeds 4, --spending obrien_fleming) to continue it, or a new --out"
        ), err
        assert record.read_bytes() == before and sorted(p.name for p in out.iterdir()) == [RECORD_FILE]


def test_the_recorded_plan_continues(tmp_path, capsys):
    path, out = _sweep_file(tmp_path, {"base": [], "b": ["mlp.ratio=2"]}), tmp_path / "out"
    out.mkdir()
    write_record(out, plan(2, 1, 4), "base", [])
    assert sweep_main([str(path), "--out", str(out), "--until-decided", "--max-seeds", "4", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "until decided: up to 3 looks at 2, 3, 4 seeds per arm (O'Brien-Fleming spending" in text
    assert sorted(line.split(":")[0] for line in text.splitlines() if "gptlab-train" in line) == [
        "[ud] b__seed0", "[ud] b__seed1", "[ud] base__seed0", "[ud] base__seed1"
    ]  # fmt: skip


def test_a_plan_stopped_half_way_is_on_record_and_only_it_may_continue(tmp_path, capsys, monkeypatch):
    """The runs stand in for real ones (written as finished run dirs); the plan is stopped by Ctrl-C while look 2's
    runs train. Before, until_decided.json was written only when the looks ended: the stopped plan left no record,
    so a second plan (--max-seeds 6) replayed look 1 under other thresholds unchallenged."""
    import gptlab.cli.sweep as sweep_cli

    launched: list[list[str]] = []

    def launch(sweep, todo, args):
        launched.append(sorted(run.name for run in todo.runs))
        if len(launched) == 2:
            raise KeyboardInterrupt  # look 2's runs are training
        for run in todo.runs:  # arms alike: undecided at look 1
            write_run(run.run_dir(sweep.sweep_dir), seed=run.seed, loss_at=lambda s, n=run.seed: 2 + 0.01 * n)
        return []

    monkeypatch.setattr(sweep_cli, "_launch", launch)
    path, out = _sweep_file(tmp_path, {"base": [], "b": ["mlp.ratio=2"]}), tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        sweep_main([str(path), "--out", str(out), "--until-decided", "--max-seeds", "4"])
    assert launched[0] == ["b__seed0", "b__seed1", "base__seed0", "base__seed1"] and len(launched) == 2
    assert {"b__seed2", "base__seed2"} <= set(launched[1])  # (the stand-ins' configs are not the plan's: rerun too)
    doc = read_record(out)
    assert doc is not None and doc["finished"] is False and doc["plan"]["seeds"] == [2, 3, 4]
    assert [sorted(taken) for taken in doc["looks"]] == [["b"]]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        sweep_main([str(path), "--out", str(out), "--until-decided", "--max-seeds", "6"])
    assert (
        exit_.value.code == 2
        and "records looks of another plan: --max-seeds 6 (recorded: 4)" in capsys.readouterr().err
    )
    assert compare_main([str(out), "--out", str(tmp_path / "cmp"), "--no-wandb", "--noise-floor", "none"]) == 0
    notes = json.loads((tmp_path / "cmp" / "comparison.json").read_text())["notes"]
    note = next(n for n in notes if "until decided" in n)
    assert note.startswith(
        "note: seeds are being added until decided and the plan has not finished: 1 of up to 3 looks taken "
        "(O'Brien-Fleming spending, alpha 0.05 overall); an arm still undecided is not final"
    ), note
    assert "'b' at look 1, undecided" in note
