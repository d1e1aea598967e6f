"""A ladder with an lr grid at every rung: gptlab-sweep plans <arm>/<rung>/lr<v>/seed<k>; gptlab-compare picks each
arm's best lr per rung, fits the ladder on those runs, and flags an arm whose best lr moves with size unlike the
baseline's (the slope's seed-bootstrap interval against the baseline's excludes 0)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from gptlab.cli.compare import main
from gptlab.cli.sweep import main as sweep_main
from gptlab.compare.studies import ladder_lr

LRS = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2]
RUNGS = {"d_model32": 1e4, "d_model64": 4e4, "d_model128": 1.6e5}  # non-embedding params
NOISE = (-0.004, 0.0, 0.004)  # seed k's offset: a small scatter around each cell's loss


def cell(path: Path, arm: str, lr: float, seed: int, size: float, final: float) -> None:
    path.mkdir(parents=True)
    rows = [{"step": 0, "val/loss": 4.0}, {"step": 5, "train/loss": 3.5}, {"step": 10, "val/loss": final}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"status": "finished", "final_val_loss": final, "params_non_embedding": size, "flops_per_token": 6 * size}
    (path / "summary.json").write_text(json.dumps(summary))
    (path / ".hydra").mkdir()
    config = {"arm": arm, "seed": seed, "optimizer": {"lr": lr}, "train": {"spike_factor": 3.0}}
    (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))


def write_sweep(root: Path, best: dict[str, dict[str, float]]) -> Path:
    """best: {arm: {rung: its best lr}}; loss = 3 - 0.1·log10(size) + 0.2·(log10 lr - log10 best)^2 + seed noise."""
    root.mkdir(parents=True)
    record = {
        "arms": {a: [] for a in best},
        "seeds": [0, 1, 2],
        "lr_grid": LRS,
        "ladder": {"model.d_model": [32, 64, 128]},
    }
    (root / "sweep.yaml").write_text(yaml.safe_dump(record, sort_keys=False))
    for arm, by_rung in best.items():
        for rung, size in RUNGS.items():
            for lr in LRS:
                for seed, noise in enumerate(NOISE):
                    loss = 3 - 0.1 * math.log10(size) + 0.2 * (math.log10(lr) - math.log10(by_rung[rung])) ** 2 + noise
                    cell(root / arm / rung / f"lr{lr:g}" / f"seed{seed}", arm, lr, seed, size, loss)
    return root


def test_the_sweep_plans_an_lr_grid_at_every_rung(tmp_path, capsys):
    path = tmp_path / "mini.yaml"
    spec = {
        "seeds": [0],
        "overrides": ["model.n_layer=1", "model.n_head=2"],
        "arms": {"mha": [], "mqa": ["attention=mqa"]},
    }
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "out"
    args = [str(path), "--out", str(out), "--dry-run", "--ladder", "model.d_model=32,64", "--lr-grid", "1e-3,1e-2"]
    assert sweep_main(args) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if ": gptlab-train " in line]
    dirs = sorted(line.split("hydra.run.dir=")[1].removeprefix(f"{out}/") for line in lines)
    expected = [f"{a}/d_model{d}/lr{lr}/seed0" for a in ("mha", "mqa") for d in (32, 64) for lr in ("0.001", "0.01")]
    assert dirs == sorted(expected)
    assert all(line.count("optimizer.lr=") == 1 and line.count("model.d_model=") == 1 for line in lines)


def test_best_lr_per_rung_its_trend_and_an_arm_whose_best_lr_moves_differently(tmp_path):
    moving = {"d_model32": 3e-3, "d_model64": 1e-3, "d_model128": 3e-4}  # falls with size (muP's problem)
    fixed = {"d_model32": 1e-3, "d_model64": 1e-3, "d_model128": 1e-3}
    sweep = write_sweep(tmp_path / "s", {"base": moving, "steady": fixed, "same": dict(moving)})
    grids, ladder = ladder_lr.read(sweep)
    assert ladder.rungs == list(RUNGS) and ladder.arms == ["base", "steady", "same"]
    doc = ladder_lr.report(grids, ladder)
    trend = {e["arm"]: e for e in doc["lr_trend"]}
    assert trend["base"]["best_lr"] == moving and trend["steady"]["best_lr"] == fixed
    expected = (math.log10(3e-4) - math.log10(3e-3)) / (math.log10(1.6e5) - math.log10(1e4))
    assert trend["base"]["slope"] == pytest.approx(expected)
    assert trend["steady"]["slope"] == pytest.approx(0.0, abs=1e-12)
    assert trend["steady"]["vs_baseline"]["moves_differently"] is True
    assert trend["same"]["vs_baseline"]["moves_differently"] is False
    assert trend["same"]["vs_baseline"]["difference"] == pytest.approx(0.0, abs=1e-12)
    # the ladder is fitted on each arm's runs at its own best lr: the lr term is 0 there, so loss = 3 - 0.1 log10 N
    rows = {a["arm"]: a for a in doc["ladder"]["arms"]}
    means = [r["mean"] for r in rows["steady"]["rungs"]]
    assert means == pytest.approx([3 - 0.1 * math.log10(n) for n in RUNGS.values()], abs=1e-9)
    assert [e["at_grid_edge"] for e in doc["lr_trend"]] == [[], [], []]

    out = tmp_path / "cmp"
    assert main([str(sweep), "--out", str(out)]) == 0  # recognised by itself: no flag
    written = json.loads((out / "ladder_lr.json").read_text())
    assert written["lr_trend"][1]["vs_baseline"]["moves_differently"] is True
    assert (out / "ladder.json").is_file() and (out / "ladder.png").stat().st_size > 1000
    assert main([str(sweep), "--lr-grid", "--out", str(out)]) == 2


def test_the_report_says_which_arm_moves_and_where_the_slope_is_a_bound(tmp_path, capsys):
    edge = {"d_model32": 1e-2, "d_model64": 1e-3, "d_model128": 3e-4}  # its best at the grid's largest lr at rung 1
    sweep = write_sweep(tmp_path / "s", {"base": dict.fromkeys(RUNGS, 1e-3), "edgy": edge})
    assert main([str(sweep), "--ladder", "--out", str(tmp_path / "cmp")]) == 0
    text = capsys.readouterr().out
    assert text.startswith("ladder x lr grid: 2 arms x 3 rungs (d_model32, d_model64, d_model128)")
    assert "edgy           best lr 0.01 (d_model32) -> 0.001 (d_model64) -> 0.0003 (d_model128)" in text
    assert "best lr at the grid's edge at d_model32: the slope is a bound" in text
    assert "its best lr MOVES DIFFERENTLY with size from base's" in text
    assert "the ladder, each arm at its own best lr at every rung:\nscale ladder: 2 arms x 3 rungs" in text


def test_every_best_lr_at_the_grids_edge_is_not_measured_never_a_zero_width_interval(tmp_path, capsys):
    """Both arms pick the grid's largest lr at every rung: every resample picks it too, so the slope read +0.00
    [+0.00, +0.00] and "moves like the baseline's"; no optimum was found at any size, so it is not measured."""
    top = dict.fromkeys(RUNGS, LRS[-1])
    sweep = write_sweep(tmp_path / "s", {"base": top, "edgy": dict(top)})
    trend = {e["arm"]: e for e in ladder_lr.report(*ladder_lr.read(sweep))["lr_trend"]}
    for arm in ("base", "edgy"):
        assert trend[arm]["all_at_grid_edge"] and trend[arm]["slope"] is None and trend[arm]["slope_ci"] is None
    assert trend["edgy"]["vs_baseline"] == {"difference": None, "ci": None, "moves_differently": None}
    assert main([str(sweep), "--ladder", "--out", str(tmp_path / "cmp")]) == 0
    text = capsys.readouterr().out
    assert "[+0.00, +0.00]" not in text and "moves like" not in text
    assert (
        "decades of best lr per decade of size: not measured (the best lr is at the grid's edge at every rung" in text
    )
    assert "vs base: slope difference not measured (" in text
