"""A reading that had to be interpolated is never a verdict: without a shared train.eval_flops grid, val loss at equal
FLOPs between evals is a chord (biased toward the arm read nearer an eval), so it is "not measured at equal FLOPs",
names the one command that measures it, and no reconciliation finding is drawn from it; on a shared grid, or where
every run evaluated at the common point, it stays a verdict."""

from __future__ import annotations

from gptlab.compare import modes
from gptlab.compare.render import matrix as matrix_text
from gptlab.compare.render import words
from gptlab.compare.render.compute import lines
from gptlab.compare.statistics.verdict import Status
from gptlab.compare.tables.matrix import Finding, Lens
from helpers.compare import write_run

BASE_COST, CHEAP = 7.2e5, 6.0e5  # FLOPs per token: the arm is cheaper per step


def _curve(level: float, seed: int):
    return lambda step: level + 2.0 * (0.97**step) + 0.002 * seed  # falling and convex: a chord sits above it


def _arms(root, arm_level: float, **extra) -> None:
    """mha (the baseline) and a cheaper mqa, 3 seeds each, evaluated every 25 steps of 100."""
    for seed in range(3):
        write_run(
            root / "mha" / f"seed{seed}", seed=seed, loss_at=_curve(1.50, seed), flops_per_token=BASE_COST, **extra
        )
        write_run(
            root / "mqa" / f"seed{seed}", seed=seed, choices={"attention": "mqa"}, loss_at=_curve(arm_level, seed),
            flops_per_token=CHEAP, **extra,
        )  # fmt: skip


def _matrix(root):
    found = modes.tables(modes.Request([str(root)], baseline="attention=mha", out=str(root / "cmp")))
    cmp = found.comparisons[0]
    return cmp, cmp.matrix.arms[0]


def _chord_level() -> float:
    """The arm level whose equal-FLOPs gap the chord reads as exactly 0: the cheaper arm ends at the baseline's step
    83.3, read on the chord between the baseline's evals 75 and 100, which sits above its curve. The true gap there
    is +0.0095 (worse); before, the chord's "within noise" became "part of the gap may be compute"."""
    y = lambda step: 2.0 * 0.97**step  # noqa: E731
    at = 100 * CHEAP / BASE_COST
    return 1.50 + y(75) + (at - 75) / 25 * (y(100) - y(75)) - y(100)


def test_an_interpolated_reading_is_not_measured_and_draws_no_finding(tmp_path):
    """Worse at equal steps; at equal FLOPs the baseline is read between its evals 75 and 100 (a chord above its
    curve): the gap there is not measured, so no "part of the gap may be compute" is drawn from it."""
    _arms(tmp_path, _chord_level())
    cmp, arm = _matrix(tmp_path)
    flops = cmp.compute.axes[0]
    assert flops.axis == "flops" and flops.interpolated and not flops.planned
    cell = arm.cells[Lens.EQUAL_FLOPS]
    assert cell.status is Status.INTERPOLATED and not cell.decided and cell.effect is None and cell.interval is None
    assert arm.cells[Lens.EQUAL_STEPS].decided  # worse at equal steps: a real verdict
    assert Finding.NOT_AT_EQUAL_FLOPS not in arm.findings and Finding.AGREE not in arm.findings
    assert Finding.FLOPS_NOT_MEASURED in arm.findings
    assert matrix_text.body(cmp.matrix)[0][2] == "not measured at equal FLOPs"
    [sentence] = matrix_text.sentences(cmp.matrix)
    assert "part of the gap may be compute" not in sentence and "not measured at equal FLOPs" in sentence
    assert "gptlab-sweep NAME --out NEW_DIR measures it" in sentence  # the one command that measures it
    said = lines(cmp.compute)
    assert any("'attention=mqa, attention.n_kv_head=1' not measured at equal FLOPs." in t for t in said)
    assert not any(words.NOISE in t for t in said if "equal training FLOPs" in t)


def test_the_command_names_the_sweep_and_a_new_dir(tmp_path):
    root = tmp_path / "attn"
    root.mkdir()
    (root / "sweep.yaml").write_text("arms: {mha: [], mqa: [attention=mqa]}\nseeds: [0, 1, 2]\n")
    _arms(root, 1.53, leaves={"sweep": "attn"})
    cmp, _ = _matrix(root)
    assert cmp.matrix.remeasure == f"gptlab-sweep attn --out {root.resolve()}-grid"


def test_on_a_shared_grid_the_reading_stays_a_verdict(tmp_path):
    """The same arms with one train.eval_flops grid (evals every 5 steps: a step-apart bracket's stand-in): the
    reading is at a grid point, measured, and keeps its Welch verdict."""
    grid = [4.0e9, 7.0e9]  # both arms reach 7e9 (the cheaper one at ~91 steps)
    _arms(tmp_path, 1.53, eval_interval=5, leaves={"train.eval_flops": grid})
    cmp, arm = _matrix(tmp_path)
    flops = cmp.compute.axes[0]
    assert flops.planned and flops.x == grid[-1] and not flops.interpolated
    assert arm.cells[Lens.EQUAL_FLOPS].status in (Status.DECIDED, Status.WITHIN_NOISE, Status.UNRESOLVED)
    assert arm.cells[Lens.EQUAL_FLOPS].interval is not None and Finding.FLOPS_NOT_MEASURED not in arm.findings


def test_equal_costs_read_at_an_eval_of_every_run_stay_a_verdict(tmp_path):
    """Arms of one cost reach equal FLOPs at the same eval: nothing is interpolated, the verdict stands."""
    for seed in range(3):
        write_run(tmp_path / "mha" / f"seed{seed}", seed=seed, loss_at=_curve(1.50, seed))
        write_run(tmp_path / "mqa" / f"seed{seed}", seed=seed, choices={"attention": "mqa"}, loss_at=_curve(1.60, seed))
    cmp, arm = _matrix(tmp_path)
    assert not cmp.compute.axes[0].interpolated and arm.cells[Lens.EQUAL_FLOPS].decided
