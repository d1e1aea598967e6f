"""An lr grid's verdict matrix and its W&B view: a best lr at the grid's edge is said in the cell and the sentence;
arms that all picked the baseline's lr get one lr column, not two identical ones, and a sentence why; --workspace on an
lr grid dir writes the view (grouped by arm and lr), and a sweep's view groups by `arm`, never merging two arms of one
attention choice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gptlab.cli.compare import main
from gptlab.compare.reading.runs import load_run
from gptlab.compare.render import workspace
from gptlab.compare.tables.matrix import Finding, Lens
from helpers.compare import write_run

LRS = (1e-3, 3e-3, 1e-2)
NEEDS_WORKSPACES = pytest.mark.skipif(
    __import__("importlib.util").util.find_spec("wandb_workspaces") is None, reason="gptlab[workspaces] not installed"
)


def _grid(root: Path, levels: dict[str, dict[float, float]]) -> Path:
    """mha and mqa at three lrs, three seeds; final val loss level + seed noise at each lr."""
    root.mkdir(parents=True)
    record = {"arms": {"mha": [], "mqa": ["attention=mqa"]}, "seeds": [0, 1, 2], "lr_grid": list(LRS)}
    (root / "sweep.yaml").write_text(yaml.safe_dump(record, sort_keys=False))
    for arm, by_lr in levels.items():
        for lr, level in by_lr.items():
            for seed in range(3):
                write_run(
                    root / arm / f"lr{lr:g}" / f"seed{seed}", seed=seed,
                    choices={"attention": arm}, leaves={"optimizer.lr": lr, "arm": arm, "sweep": root.name},
                    loss_at=lambda s, lv=level, sd=seed: lv + 0.01 * (100 - s) / 100 + 0.003 * sd,
                    data_fingerprint="data-1",
                )  # fmt: skip
    return root


def _matrix(root: Path, tmp: Path):
    assert main([str(root), "--lr-grid", "--out", str(tmp / "out"), "--no-wandb"]) == 0
    doc = json.loads((tmp / "out" / "comparison.json").read_text())
    return doc["verdict_matrix"], (tmp / "out" / "comparison.md").read_text()


def test_arms_that_picked_the_baselines_lr_get_one_lr_column_and_a_sentence(tmp_path, capsys):
    levels = {"mha": {1e-3: 1.6, 3e-3: 1.5, 1e-2: 1.55}, "mqa": {1e-3: 1.7, 3e-3: 1.56, 1e-2: 1.65}}
    m, md = _matrix(_grid(tmp_path / "g", levels), tmp_path)
    assert m["one_lr"] == "0.003" and Lens.OWN_BEST_LR.value not in m["lenses"]
    assert "| arm | Δ val loss at own best lr (the baseline's) |" in md
    assert "Δ val loss at the baseline's best lr" not in md
    assert (
        "Every arm's own best lr is the baseline's (0.003), so at its own best lr and at the baseline's best lr " in md
    )
    assert Lens.OWN_BEST_LR.value not in m["arms"][0]["cells"]  # one reading is never counted as two lenses


def test_a_best_lr_at_the_grids_edge_is_said_in_the_cell_and_the_sentence(tmp_path, capsys):
    levels = {"mha": {1e-3: 1.6, 3e-3: 1.5, 1e-2: 1.55}, "mqa": {1e-3: 1.7, 3e-3: 1.6, 1e-2: 1.52}}  # mqa: 1e-2
    m, md = _matrix(_grid(tmp_path / "g", levels), tmp_path)
    own = m["arms"][0]["cells"][Lens.OWN_BEST_LR.value]
    assert own["caveats"] == ["optimistic", "edge_lr"]
    assert m["arms"][0]["cells"][Lens.EQUAL_STEPS.value]["caveats"] == ["optimistic"]  # the baseline's pick: inside
    assert Finding.EDGE_LR.value in m["arms"][0]["findings"]
    row = next(line for line in md.splitlines() if line.startswith("| attention=mqa"))  # the matrix's
    assert row.split(" | ")[-2].endswith("(best lr at the grid's edge)")  # the own-best-lr cell
    [sentence] = [line for line in md.splitlines() if line.startswith("- attention=mqa") and " — " in line]
    assert "the best lr at the grid's edge (the arm's or the baseline's): the optimum may lie beyond it" in sentence


@NEEDS_WORKSPACES
def test_workspace_on_an_lr_grid_dir_is_written_grouped_by_arm_and_lr(tmp_path, capsys):
    levels = {"mha": {1e-3: 1.6, 3e-3: 1.5, 1e-2: 1.55}, "mqa": {1e-3: 1.7, 3e-3: 1.56, 1e-2: 1.65}}
    root = _grid(tmp_path / "g", levels)
    out = tmp_path / "out"
    assert main([str(root), "--out", str(out), "--workspace", "--no-wandb"]) == 0
    said = capsys.readouterr()
    assert "W&B workspace: wrote" in said.out and "warning" not in said.err, said.err
    spec = json.loads((out / "workspace.json").read_text())
    sections = [s["name"] for s in spec["spec"]["section"]["panelBankConfig"]["sections"]]
    assert sections[:2] == ["val/loss by arm", "val/loss by optimizer.lr"]


def test_a_sweeps_workspace_groups_by_arm_not_by_a_choice_two_arms_share(tmp_path):
    runs = []
    for arm, kv in (("mha", None), ("gqa4", 4), ("gqa2", 2)):
        for seed in range(2):
            leaves = {"arm": arm, **({"attention.n_kv_head": kv} if kv else {})}
            choices = {"attention": "gqa"} if kv else {}
            runs.append(load_run(write_run(tmp_path / arm / f"seed{seed}", seed=seed, choices=choices, leaves=leaves)))
    assert workspace.group_keys(runs) == ["arm"]  # choice/attention would merge gqa4 and gqa2
    older = [load_run(write_run(tmp_path / "o" / f"s{i}", seed=0, choices={"attention": a})) for i, a in enumerate(
        ("mha", "gqa"))]  # fmt: skip
    assert workspace.group_keys(older) == ["choice/attention"]  # runs that record no arm: as before
