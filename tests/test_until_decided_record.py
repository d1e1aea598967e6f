"""The record of an until-decided sweep (until_decided.json) as the plan's identity and as what gptlab-compare and
`gptlab-sweep status` read: other seed values are another plan, a damaged record is refused in one line (never read
as missing), status lists the runs of every look, and compare reads the table against the looks' baseline. The runs
are stand-ins written as finished run dirs (no training)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gptlab.cli.compare import main as compare_main
from gptlab.cli.sweep import main as sweep_main
from gptlab.compare.reading.runs import discover, load_run
from gptlab.compare.statistics.sequential import plan
from gptlab.compare.studies.until_decided import RECORD_FILE, look, read_record, write_record
from gptlab.compare.tables.analysis import compare
from gptlab.errors import ConfigError
from gptlab.study.until_decided import plan_for, run
from gptlab.sweep.spec import record_definition, resolve
from helpers.compare import write_run

COMPARE = ["--no-wandb", "--noise-floor", "none"]


def _sweep(tmp_path: Path, arms: dict, seeds: str | None = None, command: str | None = None):
    """The sweep as gptlab-sweep resolves it (`seeds` as --seeds gives them), its definition recorded."""
    path = tmp_path / "ud.yaml"
    spec = {"seeds": [0, 1], "overrides": ["model=tiny", "logger=none"], "arms": arms}
    path.write_text(yaml.safe_dump({**spec, **({"command": command} if command else {})}, sort_keys=False))
    sweep = resolve(str(path), [], out=tmp_path / "out", seeds=seeds, note=lambda line: None)
    if command is None:
        record_definition(sweep.sweep_dir, sweep.spec, sweep.extra, sweep.seeds, write=True)
    return sweep


def _finishing(sweep, finals: dict[str, float]):
    """A launch whose runs finish at once: each arm's final val loss, plus a little per seed."""

    def launch(todo) -> list[str]:
        for r in todo.runs:
            loss = finals[r.name.split("__")[0]] + 0.01 * r.seed
            write_run(r.run_dir(sweep.sweep_dir), seed=r.seed, loss_at=lambda step, v=loss: v)
        return []

    return launch


def test_a_relaunch_with_other_seed_values_of_the_same_count_is_another_plan(tmp_path):
    sweep = _sweep(tmp_path, {"base": [], "same": []})
    run(sweep, plan_for(sweep, 3), _finishing(sweep, {"base": 2.0, "same": 2.0}))
    assert read_record(sweep.sweep_dir)["seed_values"] == [0, 1, 2]
    assert plan_for(sweep, 3).seeds == (2, 3)  # the same seeds: the recorded plan continues
    other = _sweep(tmp_path, {"base": [], "same": []}, seeds="5,6")
    with pytest.raises(ConfigError, match=r"another plan: --seeds 5,6 \(recorded: 0,1\)") as err:
        plan_for(other, 3)
    assert "\n" not in str(err.value)


def _two_arms(root: Path, seeds: int = 3) -> None:
    """Arm 'a' (MQA, higher loss) sorts before the baseline 'base' (MHA): compare's own default picks 'a'."""
    for arm, attention, final in (("base", "mha", 2.0), ("a", "mqa", 2.3)):
        for seed in range(seeds):
            loss = final + 0.01 * seed
            run_dir = root / arm / f"seed{seed}"
            write_run(run_dir, seed=seed, choices={"attention": attention}, loss_at=lambda s, v=loss: v)


def _recorded(root: Path) -> None:
    design = plan(3, 1, 4)
    write_record(root, design, "base", [look(root, design, 0, "base", ["a"], [0, 1, 2])], seeds=[0, 1, 2, 3])


@pytest.mark.parametrize(
    "edit, what",
    [
        (lambda doc: "{not json", "not valid JSON"),
        (lambda doc: json.dumps({**doc, "looks": [{"a": {**doc["looks"][0]["a"], "p": 7}}]}), r"looks\[0\].a.p=7"),
        (lambda doc: json.dumps({k: v for k, v in doc.items() if k != "plan"}), "plan: expected a mapping"),
        (lambda doc: json.dumps({**doc, "seed_values": [0, 0, 1, 2]}), "seed_values: expected 4 distinct seeds"),
    ],
)
def test_a_damaged_record_is_refused_in_one_line_never_dropped(tmp_path, capsys, edit, what):
    root = tmp_path / "sweep"
    _two_arms(root)
    _recorded(root)
    path = root / RECORD_FILE
    path.write_text(edit(json.loads(path.read_text())))
    with pytest.raises(ConfigError, match=what):
        read_record(root)
    assert compare_main([str(root), "--out", str(tmp_path / "out"), *COMPARE]) == 2
    stderr = capsys.readouterr().err.strip()
    assert "\n" not in stderr and str(path) in stderr, stderr
    assert "a damaged or hand-edited file" in stderr and "new --out" in stderr
    assert not (tmp_path / "out" / "comparison.json").exists()


def test_compare_reads_an_until_decided_sweep_against_the_looks_baseline(tmp_path):
    root = tmp_path / "sweep"
    _two_arms(root)
    own = compare([load_run(p) for p in discover([str(root)])])
    assert "mqa" in own.baseline  # without the record compare picks arm 'a': the case the plan's baseline fixes
    _recorded(root)
    out = tmp_path / "out"
    assert compare_main([str(root), "--out", str(out), *COMPARE]) == 0
    doc = json.loads((out / "comparison.json").read_text())
    assert "mha" in doc["baseline"] and not any("is not the baseline of the looks" in n for n in doc["notes"])
    assert compare_main([str(root), "--out", str(out), "--baseline", "attention=mqa", *COMPARE]) == 0
    doc = json.loads((out / "comparison.json").read_text())
    assert "mqa" in doc["baseline"]  # an explicit --baseline still wins, with a note
    assert any("is not the baseline of the looks ('base')" in n for n in doc["notes"]), doc["notes"]


def test_status_lists_the_runs_of_every_look(tmp_path, capsys):
    sweep = _sweep(tmp_path, {"base": [], "same": []})
    done = run(sweep, plan_for(sweep, 4), _finishing(sweep, {"base": 2.0, "same": 2.0}))
    assert len(done.looks) == 3  # 'same' is never decided: seeds 2 and 3 are added at looks 2 and 3
    assert sweep_main(["status", str(sweep.sweep_dir)]) == 0
    printed = capsys.readouterr().out
    names = [f"{arm}__seed{s}" for arm in ("base", "same") for s in range(4)]
    assert all(name in printed for name in names), printed


def test_a_decode_sweep_is_refused_until_decided(tmp_path):
    sweep = _sweep(tmp_path, {"base": [], "b": []}, command="decode")
    with pytest.raises(ConfigError, match="a decode sweep has no val loss to decide on"):
        plan_for(sweep, 4)
