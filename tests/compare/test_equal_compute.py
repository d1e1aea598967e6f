"""Equal compute in gptlab-compare: val loss at equal training FLOPs and at equal training time (each arm's steps at
its step time from a timing session; "not timed" without one), interpolated between eval points, on synthetic curves
with a known answer; older runs' flops column rebuilt or "not available"; one tiny real pair of runs end to end (the
metrics.jsonl flops column, the report's section and the loss-vs-FLOPs plot)."""

from __future__ import annotations

import json

import pytest

from gptlab.cli.compare import main as compare_main
from gptlab.compare.reading.runs import load_run
from gptlab.compare.reading.timing import AXIS, read_timing
from gptlab.compare.render import words
from gptlab.compare.render.compute import lines
from gptlab.compare.statistics import stats
from gptlab.compare.statistics.verdict import Status
from gptlab.compare.tables.analysis import compare
from gptlab.compare.tables.compute import equal_compute, loss_at
from helpers.compare import write_run, write_timing
from helpers.train import rows, run_inprocess

F = 1e6  # the baseline's training FLOPs per token; write_run's runs see 128 tokens per step
BASE_OFF, ARM_OFF = [0.0, 0.01, -0.01], [0.02, 0.0, 0.01]


def _linear(off: float):
    return lambda step: 3.0 - 0.01 * step + off  # linear in step: interpolation between evals is exact


def _pair(tmp_path, arm_load: float | None = None, timed: bool = False):
    """Baseline (F FLOPs/token, 50 ms/step) and an arm 1.6x the FLOPs/token and 2x the step time, 3 seeds each;
    `timed`: with a timing session of the two (the arm's windows under `arm_load`) at those step times."""
    runs = []
    for seed, off in enumerate(BASE_OFF):
        runs.append(write_run(tmp_path / f"base{seed}", seed=seed, loss_at=_linear(off), flops_per_token=F))
    for seed, off in enumerate(ARM_OFF):
        runs.append(
            write_run(
                tmp_path / f"arm{seed}",
                seed=seed,
                choices={"attention": "mqa"},
                loss_at=_linear(off),
                flops_per_token=1.6 * F,
                step_ms=100.0,
                outside_load=arm_load,
            )
        )
    sessions = []
    if timed:  # 128 tokens a step: 50 ms is 2,560 tokens/s, 100 ms 1,280
        rates = {"base": [2560.0] * 3, "base#2": [2560.0] * 3, "arm": [1280.0, 1281.0, 1279.0]}
        arms = {"base": (runs[0].resolve(), "fp-base"), "arm": (runs[3].resolve(), "fp-arm")}
        sessions = [read_timing(write_timing(tmp_path / "timing", arms, rates, {"arm": arm_load or 0.0}))]
    return compare([load_run(p) for p in runs], baseline="attention=mha", timings=sessions)


def test_interpolation_is_linear_between_evals_and_never_extrapolates():
    assert loss_at([0.0, 10.0, 20.0], [4.0, 3.0, 1.0], 15.0) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        loss_at([0.0, 10.0], [4.0, 3.0], 11.0)


def test_equal_flops_and_training_time_on_curves_with_a_known_answer(tmp_path):
    cmp = _pair(tmp_path, arm_load=0.5, timed=True)
    ec = equal_compute(cmp)
    flops, wall = ec.axes
    # the baseline reaches 100 steps x 128 tokens x F; the arm is there at step 62.5 (between its evals 50 and 75)
    assert flops.x == pytest.approx(100 * 128 * F)
    arm_at = [3.0 - 0.625 + off for off in ARM_OFF]
    base_at = [2.0 + off for off in BASE_OFF]
    arm = flops.arms[1]
    assert arm.losses == pytest.approx(arm_at)
    expected = stats.welch_interval(arm_at, base_at, 0.05)
    assert arm.delta == pytest.approx(expected.diff)  # the chord's reading is kept (comparison.json) ...
    # ... but a reading between evals that a shared train.eval_flops grid could have measured is no verdict
    assert arm.verdict.status is Status.INTERPOLATED and arm.ci is None and flops.interpolated
    assert words.change(arm.verdict, "val loss") == "not measured at equal FLOPs" and not arm.under_load
    assert flops.remeasure == "gptlab-sweep NAME --out NEW_DIR"
    # training time, timed alone: the baseline ends at 5 s; the arm (100 ms a step) is at step 50 there; its timing
    # windows ran under outside load
    assert wall.axis == AXIS and wall.x == pytest.approx(5.0)
    assert wall.arms[1].losses == pytest.approx([2.5 + off for off in ARM_OFF])
    assert words.change(wall.arms[1].verdict, "val loss") == "higher val loss, under outside load"
    assert wall.arms[1].under_load and wall.arms[1].verdict.direction == 1
    assert len(ec.rebuilt) == 6  # synthetic runs predate the column: rebuilt from flops_per_token x tokens
    text = lines(ec)
    assert (
        "Val loss at equal training FLOPs (1.28e+10 FLOPs, the most every run reached): "
        "'attention=mqa, attention.n_kv_head=1' not measured at equal FLOPs." in text
    )
    assert any(
        t.startswith("Equal training FLOPs is not measured") and "gptlab-sweep NAME --out NEW_DIR" in t for t in text
    )


def test_without_a_timing_session_equal_training_time_is_not_timed(tmp_path):
    """The same pair untimed: the training runs recorded their step times (50 and 100 ms), yet no equal-time verdict
    comes from them: every cell reads "not timed"."""
    ec = equal_compute(_pair(tmp_path, arm_load=0.5))
    time = ec.axes[1]
    assert time.axis == AXIS and time.x is None and time.missing.startswith("not timed")
    assert [a.verdict.status for a in time.arms] == [Status.NOT_MEASURED] * 2
    assert words.change(time.arms[1].verdict, "val loss") == "not timed"
    assert "Val loss at equal training time, timed alone: not timed: no timing session times the baseline." in lines(ec)


def test_equal_curves_are_within_noise(tmp_path):
    """An arm with the baseline's loss per FLOP: at equal FLOPs the Welch interval covers zero."""
    runs = [
        write_run(tmp_path / f"b{s}", seed=s, loss_at=_linear(o), flops_per_token=F) for s, o in enumerate(BASE_OFF)
    ]
    runs += [
        write_run(tmp_path / f"a{s}", seed=s, choices={"attention": "mqa"}, loss_at=_linear(o), flops_per_token=F)
        for s, o in enumerate(BASE_OFF[::-1])
    ]
    flops = equal_compute(compare([load_run(p) for p in runs], baseline="attention=mha")).axes[0]
    assert flops.arms[1].verdict.status is Status.WITHIN_NOISE and flops.arms[1].ci[0] < 0 < flops.arms[1].ci[1]


def test_a_run_without_flops_or_flops_per_token_is_not_available(tmp_path):
    runs = [write_run(tmp_path / "b", flops_per_token=None), write_run(tmp_path / "a", choices={"attention": "mqa"})]
    ec = equal_compute(compare([load_run(p) for p in runs], baseline="attention=mha"))
    assert ec.axes[0].x is None and ec.axes[0].missing.startswith("not available:")
    assert "no flops column and no flops_per_token" in ec.axes[0].missing
    assert ec.axes[1].missing.startswith("not timed")  # no timing session: no equal-time reading either
    assert any(t.startswith("Val loss at equal training FLOPs: not available") for t in lines(ec))


@pytest.mark.slow
def test_real_runs_write_the_flops_column_and_compare_reports_equal_compute(tmp_path, capsys):
    """Two tiny real runs: mha and a params-matched mqa; eval rows carry flops = tokens x flops_per_token."""
    base = run_inprocess(tmp_path / "sweep" / "mha", steps=4, eval_interval=2)
    arm = run_inprocess(tmp_path / "sweep" / "mqa", "attention=mqa", "model.match=params", steps=4, eval_interval=2)
    for name, summary in (("mha", base), ("mqa", arm)):
        evals = [r for r in rows(tmp_path / "sweep" / name) if "val/loss" in r]
        assert [r["step"] for r in evals] == [0, 2, 4]
        assert [r["flops"] for r in evals] == pytest.approx([r["tokens"] * summary["flops_per_token"] for r in evals])
    out = tmp_path / "cmp"
    assert compare_main([str(tmp_path / "sweep"), "--out", str(out), "--no-wandb", "--baseline", "attention=mha"]) == 0
    doc = json.loads((out / "comparison.json").read_text())["equal_compute"]
    flops, wall = doc["axes"]
    ends = [s["tokens"] * s["flops_per_token"] for s in (base, arm)]
    assert flops["x"] == pytest.approx(min(ends))  # the most training FLOPs both runs reached
    assert wall["x"] is None and wall["arms"][1]["verdict"]["status"] == "not_measured"  # words: "not timed"
    assert [m["residual"] for m in doc["matched"].values()] == [arm["match"]["residual"]]  # the mqa arm only
    assert (out / "val_loss_vs_flops.png").is_file()
    md = (out / "comparison.md").read_text()
    assert "## Equal compute" in md and "params matched to the baseline" in md
    assert "Val loss at equal training FLOPs" in capsys.readouterr().out


def _grid_runs(root, eval_interval: int, grid: list[float]) -> None:
    for arm, extra in (("mha", []), ("mqa", ["attention=mqa"])):
        for seed in (0, 1):
            run_inprocess(
                root / arm / f"seed{seed}", *extra, f"seed={seed}", f"train.eval_flops=[{','.join(map(str, grid))}]",
                steps=20, eval_interval=eval_interval,
            )  # fmt: skip


def test_sparse_and_dense_evals_give_the_same_delta_on_a_shared_flops_grid(tmp_path):
    """The same runs evaluated every 10 steps and every 2 steps, with one shared train.eval_flops grid: the val loss
    at equal FLOPs is read on the grid, between evals a step apart, so the two schedules give the same Δ (1e-3);
    a chord across 10 steps of a falling curve would not."""
    per_step = {}
    for arm, extra in (("mha", []), ("mqa", ["attention=mqa"])):
        s = run_inprocess(tmp_path / "probe" / arm, *extra, steps=1, eval_interval=1)
        per_step[arm] = s["flops_per_token"] * s["tokens"]  # one step's training FLOPs
    cheapest_end = 20 * min(per_step.values())
    grid = [round(cheapest_end * f) for f in (0.33, 0.57, 0.87)]  # between evals of every schedule
    deltas = {}
    for name, every in (("sparse", 10), ("dense", 2)):
        _grid_runs(tmp_path / name, every, grid)
        runs = [load_run(p) for p in sorted((tmp_path / name).glob("*/seed*"))]
        ec = equal_compute(compare(runs, baseline="attention=mha"))
        flops = ec.axes[0]
        assert flops.planned and flops.x == grid[-1]
        arm = flops.arms[1]
        assert all(hi - lo < 0.05 for lo, hi in arm.brackets)  # a step apart: a narrow bracket
        deltas[name] = arm.delta
    assert deltas["sparse"] == pytest.approx(deltas["dense"], abs=1e-3)
