"""What gptlab-sweep's command line adds to a sweep file is checked as the file is: a seed given twice in --seeds and
an extra override of a key an arm sets are refused in one line (exit 2) before anything is planned or written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gptlab.cli.sweep import main as sweep_main


def _sweep_file(tmp_path: Path) -> Path:
    path = tmp_path / "two.yaml"
    arms = {"base": ["attention=mha", "attention.impl=naive"], "fast": ["attention=gqa", "attention.impl=sdpa"]}
    path.write_text(
        yaml.safe_dump({"seeds": [0, 1], "overrides": ["train.max_steps=4"], "arms": arms}, sort_keys=False)
    )
    return path


def _refused(tmp_path: Path, capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        sweep_main([str(_sweep_file(tmp_path)), "--out", str(tmp_path / "out"), "--dry-run", *args])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and "\n" not in err, err
    assert not (tmp_path / "out").exists()  # nothing planned or written
    return err


def test_a_seed_given_twice_in_seeds_is_refused(tmp_path, capsys):
    # it planned base__seed0 and fast__seed0 twice each (two launches into one run dir), and --until-decided counted
    # the repeated seed's run as two seeds
    err = _refused(tmp_path, capsys, "--seeds", "0,0,1")
    assert err == "error: --seeds: '0,0,1' lists seed 0 twice (it would count as two seeds); allowed: distinct integers"


@pytest.mark.parametrize(
    "override, arm, theirs",
    [
        ("attention.impl=sdpa", "base", "attention.impl=naive"),
        ("++attention.impl=flash", "base", "attention.impl=naive"),
        ("attention=mqa", "base", "attention=mha"),
    ],
)
def test_an_extra_override_of_an_arms_key_is_refused(tmp_path, capsys, override, arm, theirs):
    # it ran base with `attention.impl=naive ... attention.impl=sdpa`: the arm's own setting silently replaced
    err = _refused(tmp_path, capsys, override)
    assert err == (
        f"error: {override}: arm '{arm}' sets {theirs}, which this override would replace in every run of the arm; "
        "drop it, or change the arm in the sweep file (allowed: overrides of keys no arm sets)"
    )


def test_an_extra_override_of_a_shared_key_still_applies_to_every_arm(tmp_path, capsys):
    args = [str(_sweep_file(tmp_path)), "train.max_steps=2", "--out", str(tmp_path / "out"), "--seeds", "1,0"]
    assert sweep_main([*args, "--dry-run"]) == 0
    plans = [line for line in capsys.readouterr().out.splitlines() if "gptlab-train" in line]
    assert sorted(line.split(":")[0] for line in plans) == [
        "[two] base__seed0", "[two] base__seed1", "[two] fast__seed0", "[two] fast__seed1"
    ]  # fmt: skip  # each run once
    base = next(line for line in plans if "base__seed0" in line)
    assert "attention.impl=naive train.max_steps=2 sweep=two arm=base seed=0" in base and "sdpa" not in base
