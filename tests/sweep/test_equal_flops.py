"""--equal-flops N: every arm of a sweep evaluates at one grid of N cumulative-training-FLOPs points, planned from
each arm's own cost before anything runs, so gptlab-compare reads equal FLOPs where it measured."""

from __future__ import annotations

import math
import re

import pytest
import yaml

from gptlab.cli.sweep import main as sweep_main
from gptlab.errors import ConfigError
from gptlab.sweep.equal_flops import ArmCost, grid, parse_points, plan
from helpers.train import rows, run_inprocess

SHARED = [
    "model.n_layer=1", "model.d_model=32", "model.n_head=4", "model.block_size=32", "train.batch_size=4",
    "train.max_steps=8", "train.eval_interval=8", "logger=none", "sample.tokens=0",
]  # fmt: skip
ARMS = {"wide": ["mlp.ratio=4"], "narrow": ["mlp.ratio=2", "train.max_steps=12"]}


def sweep_file(tmp_path, **extra):
    path = tmp_path / "mini.yaml"
    path.write_text(yaml.safe_dump({"seeds": [0], "overrides": SHARED, "arms": ARMS, **extra}, sort_keys=False))
    return path


def test_the_grid_is_n_equal_points_up_to_the_cheapest_arms_budget_rounded_down():
    costs = [ArmCost("a", 1000.5, 10), ArmCost("b", 300.0, 30)]  # totals 10005 and 9000
    assert grid(costs, 4) == [2250, 4500, 6750, 9000]
    assert grid([ArmCost("a", 333.3, 3)], 3) == [333, 666, 999]  # 999.9 rounded down: never past the end
    for bad in ("0", "101", "2.5", "x", "-1"):
        with pytest.raises(
            ConfigError, match=r"^--equal-flops '.*': allowed: off, or a whole number .* from 1 to 100$"
        ):
            parse_points(bad)


def test_every_planned_run_carries_the_same_grid(tmp_path, capsys):
    out = tmp_path / "out"
    assert sweep_main([str(sweep_file(tmp_path)), "--out", str(out), "--dry-run", "--equal-flops", "3"]) == 0
    text = capsys.readouterr().out
    lines = [line for line in text.splitlines() if ": gptlab-train " in line]
    grids = {re.search(r"train\.eval_flops=(\[[0-9,]+\])", line).group(1) for line in lines}
    assert len(lines) == 2 and len(grids) == 1  # one grid for every run
    assert "note: equal FLOPs: every arm evaluated at 3 shared points" in text and "(wide, 8 steps)" in text


def test_the_grid_is_costed_as_training_costs_it_and_each_point_is_evaluated_a_step_either_side(tmp_path):
    override, _ = plan({arm: [*SHARED, *own] for arm, own in ARMS.items()}, 3)
    points = yaml.safe_load(override.split("=", 1)[1])
    totals = {}
    for arm, own in ARMS.items():
        run = tmp_path / arm
        steps = 12 if arm == "narrow" else 8
        summary = run_inprocess(run, *SHARED[:5], *own, override, "logger=none", steps=steps, eval_interval=100)
        totals[arm] = summary["flops_per_token"] * 4 * 32 * steps  # what training itself counted
        evals = {r["step"]: r["flops"] for r in rows(run) if "val/loss" in r and "flops" in r}
        per_step = summary["flops_per_token"] * 4 * 32
        for x in points:
            below, above = math.floor(x / per_step), math.ceil(x / per_step)
            assert {s for s in (below, above) if 1 <= s <= steps} <= set(evals), (arm, x, sorted(evals))
        assert max(evals.values()) >= points[-1]  # every arm reaches the last point
    top = min(totals.values())  # wide: 8 steps of the bigger MLP cost less than narrow's 12 of the smaller
    assert top == totals["wide"] and points == [math.floor(top * k / 3) for k in (1, 2, 3)]


@pytest.mark.parametrize(
    ("extra", "args", "words"),
    [
        ({}, ["--ladder", "model.d_model=32,64"], "--equal-flops: a ladder's rungs differ in size by design"),
        ({"arms": {"a": ["train.eval_flops=[1e6]"], "b": []}}, [], "--equal-flops: arm 'a' sets train.eval_flops"),
        ({}, ["--equal-flops", "0"], "--equal-flops '0': allowed"),
    ],
)
def test_what_cannot_share_a_grid_is_refused_in_one_line(tmp_path, capsys, extra, args, words):
    path = sweep_file(tmp_path, **extra)
    given = args if "--equal-flops" in args else [*args, "--equal-flops", "2"]
    with pytest.raises(SystemExit) as exit_:
        sweep_main([str(path), "--out", str(tmp_path / "out"), "--dry-run", *given])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.startswith("error: ") and words in err and "\n" not in err, err
    assert not (tmp_path / "out").exists()
