"""Each arm at its own best lr: gptlab-sweep --lr-grid runs arm x lr x seed in one launch into <arm>/lr<v>/seed<k>;
gptlab/compare/studies/lr_grid.py picks each arm's best lr, warns at the grid's edge, gives both verdicts and counts a
divergence (not a crash) in the stability margin."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from gptlab.compare.render import words
from gptlab.compare.render.lr_grid import format_report, plot_curves
from gptlab.compare.statistics.verdict import Caveat, Status
from gptlab.compare.studies.lr_grid import DIVERGE_FACTOR, read_grid, report
from gptlab.errors import ConfigError
from gptlab.sweep.layout import parse_lr_grid
from helpers.cli import cli_env, run_cli


def fake_run(run_dir: Path, start: float, final: float | None, spikes: int = 0, nan: bool = False) -> None:
    """A run dir as gptlab-train leaves it: val rows at steps 0 and 10, a summary when it finished."""
    run_dir.mkdir(parents=True)
    rows = [{"step": 0, "val/loss": start}, {"step": 5, "train/loss": float("nan") if nan else start}]
    rows += [{"step": 6, "spike/loss": 9.0}] * spikes
    if final is not None:
        rows.append({"step": 10, "val/loss": final})
        (run_dir / "summary.json").write_text(json.dumps({"status": "finished", "final_val_loss": final}))
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def grid(tmp_path: Path, table: dict) -> Path:
    """table: {arm: {lr: [final per seed] (None = diverged with NaN)}}."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({"arms": {a: [] for a in table}}, sort_keys=False))
    for arm, by_lr in table.items():
        for lr, finals in by_lr.items():
            for seed, final in enumerate(finals):
                fake_run(tmp_path / arm / f"lr{lr:g}" / f"seed{seed}", 4.0, final, nan=final is None)
    return tmp_path


def test_lr_grid_syntax():
    assert parse_lr_grid("3e-4,1e-3,3e-3") == [3e-4, 1e-3, 3e-3]
    assert parse_lr_grid("1e-4:1e-2:3") == [1e-4, 1e-3, 1e-2]
    assert parse_lr_grid([1e-3, 2e-3]) == [1e-3, 2e-3]
    for bad in ("1e-3,-1", "a,b", "1e-4:1e-2:1", "1e-3,1e-3"):
        with pytest.raises(ConfigError, match="^lr grid"):
            parse_lr_grid(bad)


def test_best_lr_edge_warning_both_verdicts_and_stability(tmp_path):
    sweep = grid(
        tmp_path,
        {
            "base": {1e-3: [3.0, 3.02, 2.98], 3e-3: [2.5, 2.52, 2.48], 1e-2: [2.7, 2.71, 2.69]},
            # prefers the largest lr tried (an edge), and at base's lr it is worse than at its own
            "wide": {1e-3: [3.1, 3.11, 3.09], 3e-3: [2.6, 2.61, 2.59], 1e-2: [2.2, 2.21, 2.19]},
            # its largest lr diverges in one seed (NaN) and blows up in another (final > 1.5 x start)
            "fragile": {1e-3: [2.9, 2.91, 2.89], 3e-3: [2.45, 2.47, 2.46], 1e-2: [None, 7.0, 2.4]},
        },
    )
    doc = report(read_grid(sweep))
    rows = {r.arm: r for r in doc.rows}
    assert [r.arm for r in doc.rows] == ["base", "wide", "fragile"]  # sweep.yaml's order: base first
    assert rows["base"].best_lr == 3e-3 and rows["wide"].best_lr == 1e-2 and rows["fragile"].best_lr == 3e-3
    assert [words.note(w) for w in doc.warnings] == [
        "warning: wide's best lr 0.01 is the largest tried: extend the grid to larger lrs"
    ]
    assert (doc.warnings[0].subject, doc.warnings[0].fix) == ("wide", "extend the grid to larger lrs")
    assert doc.to_json()["warnings"] == ["wide's best lr 0.01 is the largest tried: extend the grid to larger lrs"]
    versus = rows["wide"].versus
    assert versus is not None and rows["base"].versus is None
    own, shared = versus.own_best, versus.shared_lr
    assert own.effect == pytest.approx(-0.3) and own.direction == -1 and Caveat.OPTIMISTIC in own.caveats
    assert shared.effect == pytest.approx(0.1) and shared.direction == 1
    assert "-0.3000 [" in format_report(doc) and "+0.1000 [" in format_report(doc)
    assert rows["fragile"].max_stable_lr == 3e-3 and rows["base"].max_stable_lr == 1e-2
    assert rows["fragile"].diverged_runs == 2  # the NaN seed and the 7.0 > 1.5 x 4.0 seed, counted
    assert 7.0 > DIVERGE_FACTOR * 4.0 and "optimistic" in doc.selection.text
    text = format_report(doc)
    assert "wide" in text and "warning: wide's best lr" in text
    assert plot_curves(read_grid(sweep), tmp_path / "lr.png").stat().st_size > 1000


def test_compare_cli_lr_grid_table_and_one_line_errors(tmp_path):
    sweep = grid(tmp_path / "s", {"base": {1e-3: [3.0, 3.1], 3e-3: [2.5, 2.6]}, "other": {1e-3: [2.9, 3.0]}})
    done = run_cli("gptlab.cli.compare", str(sweep), "--lr-grid")
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.splitlines()[0].startswith("arm") and "warning: base's best lr 0.003 is the largest" in done.stdout
    )
    assert json.loads((sweep / "comparison" / "lr_grid.json").read_text())["rows"][0]["best_lr"] == 3e-3
    bad = run_cli("gptlab.cli.compare", str(tmp_path), "--lr-grid", "--holdout-seeds", "x")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--holdout-seeds 'x'" in bad.stderr


def test_holdout_seeds_pick_on_the_others(tmp_path):
    # seed 2 alone would pick 1e-2; seeds 0 and 1 pick 3e-3 and the verdict uses seed 2 only
    sweep = grid(tmp_path, {"base": {3e-3: [2.0, 2.0, 3.0], 1e-2: [2.5, 2.5, 2.1]}})
    doc = report(read_grid(sweep), holdout={2})
    assert doc.rows[0].best_lr == 3e-3 and doc.rows[0].val_loss_at_best == 3.0
    assert "holdout seeds [2]" in doc.selection.text


def test_a_seed_that_diverged_at_the_judged_lr_leaves_no_verdict(tmp_path):
    """At the baseline's lr "shaky" diverges in 2 of 5 seeds; the 3 that survive are 0.1 lower, which read as a
    decided "lower" with the 2 left out. Under --holdout-seeds a holdout seed that diverged at the pick did the same."""
    five = [3.0, 3.01, 3.02, 3.03, 3.04]
    sweep = grid(
        tmp_path / "shared",
        {
            "base": {1e-3: five, 3e-4: [v + 0.2 for v in five]},
            "shaky": {1e-3: [2.9, 2.91, 2.92, None, None], 3e-4: [v - 0.05 for v in five]},
        },
    )
    shutil.rmtree(sweep / "shaky" / "lr0.001" / "seed4")  # two diverged runs with equal files would be one copied
    fake_run(sweep / "shaky" / "lr0.001" / "seed4", 4.1, None, nan=True)
    row = report(read_grid(sweep)).rows[1]
    assert row.versus is not None
    assert row.best_lr == 3e-4 and row.versus.own_best.decided  # its own best: every seed finished
    assert row.versus.shared_lr.status is Status.NOT_MEASURED
    assert (row.versus.own_best_diverged, row.versus.shared_lr_diverged) == ([0, 0], [2, 0])
    assert "| n/a (shaky: 2 seeds diverged at 0.001)" in format_report(report(read_grid(sweep)))
    six = [3.0, 3.01, 3.02, 3.03, 3.04, 3.05]
    held = grid(
        tmp_path / "holdout",
        {
            "base": {1e-3: six, 3e-3: [v + 0.1 for v in six]},
            "arm": {1e-3: six, 3e-3: [v - 0.1 for v in six[:5]] + [None]},
        },
    )
    row = report(read_grid(held), holdout={3, 4, 5}).rows[1]
    assert row.versus is not None
    assert row.best_lr == 3e-3 and row.versus.own_best.status is Status.NOT_MEASURED
    assert row.versus.own_best_diverged == [1, 0]


def test_the_own_best_table_names_a_holdout_seed_that_diverged_there(tmp_path):
    """The report's main table (each arm at its own best lr, the holdout seeds) reads the runs that finished: a holdout
    seed that diverged at the pick is left out of it, so the report says so beside the grid's n/a verdict."""
    from gptlab.cli.compare import main as compare_main
    from helpers import golden

    args = golden.lr_grid_report(tmp_path)
    diverged = Path(args[0]) / "mqa" / "lr0.01" / "seed2" / "metrics.jsonl"  # mqa's pick on seed 0: lr 0.01
    diverged.write_text(diverged.read_text() + json.dumps({"step": 101, "train/loss": float("nan")}) + "\n")
    assert compare_main([*args, "--holdout-seeds", "1,2"]) == 0
    doc = json.loads((tmp_path / "out" / "comparison.json").read_text())
    line = (
        "warning: mqa: 1 verdict seed diverged at its best lr 0.01; this table reads the seeds that finished, the "
        "grid's own-best verdict is n/a"
    )
    assert line in doc["warnings"] and line in (tmp_path / "out" / "comparison.md").read_text()
    grid_doc = json.loads((tmp_path / "out" / "lr_grid.json").read_text())
    assert grid_doc["rows"][1]["vs_baseline_own_best"]["status"] == "not_measured"


@pytest.mark.slow  # 12 tiny runs through the local queue (~1 min on 2 cores)
def test_a_two_arm_three_lr_two_seed_grid_end_to_end(tmp_path):
    spec = {
        "seeds": [0, 1],
        "overrides": [
            "model.n_layer=1", "model.d_model=32", "model.n_head=4", "model.block_size=32", "train.batch_size=8",
            "train.eval_sequences=16", "sample.tokens=0", "logger=none", "hardware.dtype=fp32", "train.max_steps=30",
            "train.eval_interval=10", "schedule.warmup_steps=0", "optimizer.weight_decay=0",
        ],
        "arms": {"mha": ["attention=mha"], "mqa": ["attention=mqa"]},
    }  # fmt: skip
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "out"
    done = run_cli(
        "gptlab.cli.sweep", str(path), "--out", str(out), "--lr-grid", "1e-3,1e-2,5", env=cli_env(OMP_NUM_THREADS="1"),
        timeout=900,
    )  # fmt: skip
    assert "local queue: 12 runs" in done.stdout  # one launch for arm x lr x seed
    assert sorted(p.relative_to(out).as_posix() for p in out.glob("*/lr*/seed*")) == [
        f"{a}/lr{lr}/seed{s}" for a in ("mha", "mqa") for lr in ("0.001", "0.01", "5") for s in (0, 1)
    ]
    doc = report(read_grid(out))
    for row in doc.rows:
        assert row.best_lr in (1e-3, 1e-2)  # lr 5 diverges: never the pick
        assert row.max_stable_lr == 1e-2 and row.diverged_runs >= 1
    assert done.returncode in (0, 1)  # a diverged run may end non-zero; the sweep itself completes
    shown = run_cli("gptlab.cli.compare", str(out), "--lr-grid", "--holdout-seeds", "1")
    assert shown.returncode == 0, shown.stderr
    assert "holdout seeds [1]" in shown.stdout and (out / "comparison" / "lr_grid.json").is_file()


@pytest.mark.parametrize("factor, shown", [(None, "—"), (3.0, "2")])
def test_spikes_are_a_dash_when_spike_detection_was_off(tmp_path, factor, shown):
    """A run with train.spike_factor null never looked for spikes: '0 spikes' would claim it had; '—' says so."""
    sweep = grid(tmp_path, {"base": {1e-3: [3.0, 3.1]}, "arm": {1e-3: [3.2, 3.3]}})
    for run in sweep.glob("*/lr*/seed*"):
        (run / ".hydra").mkdir()
        (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"train": {"spike_factor": factor}}))
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        rows += [{"step": 7, "spike/loss": 9.0}] if factor else []
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = report(read_grid(sweep))
    assert doc.rows[0].spikes_at_best == (None if factor is None else 2)
    line = next(row for row in format_report(doc).splitlines() if row.startswith("base"))
    assert line.split()[7] == shown  # arm, best lr, loss ± std, max stable lr, diverged, spikes


def test_compare_recognises_an_lr_grid_sweep_dir_by_itself(tmp_path, capsys):
    from gptlab.cli.compare import main

    sweep = grid(tmp_path / "s", {"base": {1e-3: [3.0, 3.1], 1e-2: [2.9, 2.95]}, "arm": {1e-3: [3.2, 3.3]}})
    record = yaml.safe_load((sweep / "sweep.yaml").read_text())
    (sweep / "sweep.yaml").write_text(yaml.safe_dump({**record, "lr_grid": [1e-3, 1e-2]}, sort_keys=False))
    assert main([str(sweep)]) == 0  # no --lr-grid: sweep.yaml says it is one
    out = capsys.readouterr().out
    assert "best lr" in out and (sweep / "comparison" / "lr_grid.json").is_file()
