"""gptlab-compare on runs with extra validation sets (data.val_sets): a verdict per set with the val-loss statistics,
in every report (terminal, comparison.md/.html/.json, the W&B tables), and like with like per set: runs that scored
different sets under one name are never pooled (one warning line), and the sets never split an arm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptlab.cli.compare import main
from gptlab.compare.statistics.stats import welch_interval, welch_test
from helpers.compare import write_run
from helpers.train import rows, run_inprocess

SEEDS = (0, 1)
# per arm and set: the final loss of seed 0 and 1. gqa helps on code and hurts on prose; the pooled val loss is equal
LOSSES = {
    "mha": {"code": (2.00, 2.02), "prose": (3.00, 3.01)},
    "gqa": {"code": (1.80, 1.81), "prose": (3.20, 3.22)},
}
FINGERPRINTS = {"code": "val_set:cccc:7200", "prose": "val_set:pppp:9000"}


def _write(root: Path, fingerprints: dict[tuple[str, int], dict[str, str]] | None = None) -> Path:
    """2 arms x 2 seeds whose eval rows carry val/code/loss and val/prose/loss (scaled so the last eval is LOSSES),
    and whose summary.json records each set; `fingerprints` overrides a run's set fingerprints."""
    for arm, sets in LOSSES.items():
        for seed in SEEDS:
            run = write_run(
                root / arm / f"seed{seed}",
                seed=seed,
                choices={"attention": arm},
                loss_at=lambda step, seed=seed: 2.5 + 0.001 * seed,
                fingerprint=f"fp-{arm}",
                data_fingerprint="data-1",
                leaves={"data.val_sets": [{"name": "code", "paths": ["code.txt"]}]} if seed else {},
            )
            records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            for r in records:
                if "val/loss" in r:
                    r |= {
                        f"val/{name}/loss": values[seed] + 0.5 * (1 - r["step"] / 100) for name, values in sets.items()
                    }
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
            summary = json.loads((run / "summary.json").read_text())
            prints = {**FINGERPRINTS, **(fingerprints or {}).get((arm, seed), {})}
            summary["val_sets"] = {
                name: {"final_loss": values[seed], "fingerprint": prints[name], "tokens": 9000, "sequences": 16}
                for name, values in sets.items()
            }
            (run / "summary.json").write_text(json.dumps(summary))
    return root


def _compare(root: Path, out: Path, capsys) -> tuple[dict, str]:
    code = main([str(root), "--out", str(out), "--no-wandb", "--noise-floor", "none", "--baseline", "attention=mha"])
    assert code == 0
    said = capsys.readouterr()
    return json.loads((out / "comparison.json").read_text()), said.out + said.err


def test_each_val_set_gets_its_own_verdict_in_every_report(tmp_path, capsys):
    doc, terminal = _compare(_write(tmp_path / "runs"), tmp_path / "out", capsys)
    assert len(doc["rows"]) == 2  # one arm per attention choice: a set's config never splits an arm
    sets = {r["name"]: r for r in doc["val_sets"]}
    assert set(sets) == {"code", "prose"}
    for name, better in (("code", True), ("prose", False)):
        row = sets[name]
        assert row["metric"] == f"val/{name}/loss" and row["fingerprint"] == f"{FINGERPRINTS[name]} (16 sequences)"
        base, arm = row["cells"]
        assert (base["label"], base["values"]) == ("attention=mha", pytest.approx(list(LOSSES["mha"][name])))
        assert arm["values"] == pytest.approx(list(LOSSES["gqa"][name]))
        a, b = LOSSES["gqa"][name], LOSSES["mha"][name]
        assert arm["delta"] == pytest.approx(sum(a) / 2 - sum(b) / 2)
        assert arm["verdict"]["p"] == pytest.approx(welch_test(a, b).p)
        span = welch_interval(a, b, 0.05)
        assert arm["verdict"]["interval"] == pytest.approx([span.lo, span.hi])
        assert arm["verdict"]["status"] == "decided" and (arm["delta"] < 0) == better
        assert base["verdict"] is None
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "## Validation sets" in md and "Validation-set table:" in md
    # each Δ with the 95% interval COMPARE.md promises, not only p
    code, prose = (welch_interval(LOSSES["gqa"][n], LOSSES["mha"][n], 0.05) for n in ("code", "prose"))
    assert (
        f"| val/code/loss | 2.0100 ± 0.0141 | 1.8050 ± 0.0071 Δ -0.2050 [{code.lo:+.4f}, {code.hi:+.4f}] better (p="
        in md
    )
    assert (
        f"| val/prose/loss | 3.0050 ± 0.0071 | 3.2100 ± 0.0141 Δ +0.2050 [{prose.lo:+.4f}, {prose.hi:+.4f}] worse (p="
        in md
    )
    html = (tmp_path / "out" / "comparison.html").read_text()
    assert "Validation sets</h2>" in html and '<table class="val-sets">' in html
    assert "validation sets (mean ± std over seeds" in terminal and "val/prose/loss" in terminal


def test_the_wandb_comparison_logs_the_same_table(tmp_path, capsys):
    from types import SimpleNamespace as NS

    from gptlab.compare.render import per_arm
    from gptlab.compare.render.sections import Document
    from gptlab.compare.render.wandb_log import report_tables
    from gptlab.compare.tables.val_sets import val_set_rows

    runs = [
        NS(by_step={100: {"val/code/loss": v}}, summary={"val_sets": {"code": {"fingerprint": "f"}}}) for v in (1, 2)
    ]
    rows_, warnings = val_set_rows([NS(runs=runs[:1]), NS(runs=runs[1:])], ["a", "b"], NS(step_of=lambda r: 100))
    table = per_arm.table(per_arm.VAL_SETS, [(r.metric, "lower", r.cells) for r in rows_])
    logged = report_tables(Document("val sets", "", (table,)))
    assert set(logged) == {"val_sets"} and logged["val_sets"].columns == ["validation set", "a", "b"]
    assert logged["val_sets"].data == [list(row) for row in table.rows] and warnings == []


def test_runs_that_scored_another_set_under_one_name_are_never_pooled(tmp_path, capsys):
    edited = {("gqa", 1): {"code": "val_set:dddd:7100"}}  # one run's code set had other content
    doc, terminal = _compare(_write(tmp_path / "runs", edited), tmp_path / "out", capsys)
    assert [r["name"] for r in doc["val_sets"]] == ["prose"]
    (warning,) = [w for w in doc["warnings"] if "val/code/loss" in w]
    assert warning == (
        "warning: val/code/loss: the runs scored different sets under this name (val_set:cccc:7200 (16 sequences), "
        "val_set:dddd:7100 (16 sequences); summary.json val_sets), so it is left out of the validation-set table"
    )
    assert "\n" not in warning and " ".join(warning.split()) in " ".join(terminal.split())


def test_an_arm_that_builds_the_baseline_model_is_noise_on_every_set(tmp_path, capsys):
    root = _write(tmp_path / "runs")
    for seed in SEEDS:  # gqa's runs recorded mha's model fingerprint: the same experiment twice
        path = root / "gqa" / f"seed{seed}" / "summary.json"
        path.write_text(path.read_text().replace('"fp-gqa"', '"fp-mha"'))
    doc, _ = _compare(root, tmp_path / "out", capsys)
    assert {r["name"]: r["cells"][1]["verdict"]["status"] for r in doc["val_sets"]} == {
        "code": "identical",
        "prose": "identical",
    }


def test_a_real_sweep_with_val_sets_gets_a_verdict_per_set(tmp_path, capsys):
    (tmp_path / "code.txt").write_text("def f(x):\n    return [i * x for i in range(9)]\n" * 60)
    (tmp_path / "prose.txt").write_text("The rain in Spain stays mainly in the plain, she said.\n" * 60)
    code, prose = tmp_path / "code.txt", tmp_path / "prose.txt"
    tiny = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.block_size=32", "train.batch_size=4"]
    tiny += [
        "train.eval_sequences=4",
        f"data.val_sets=[{{name: code, paths: ['{code}']}}, {{name: prose, paths: ['{prose}']}}]",
    ]
    for arm in ("mha", "mqa"):
        for seed in SEEDS:
            run_inprocess(
                tmp_path / "sweep" / arm / f"seed{seed}",
                *tiny,
                f"attention={arm}",
                f"seed={seed}",
                steps=2,
                eval_interval=2,
            )
    doc, _ = _compare(tmp_path / "sweep", tmp_path / "out", capsys)
    assert len(doc["rows"]) == 2 and [r["name"] for r in doc["val_sets"]] == ["code", "prose"]
    for row in doc["val_sets"]:
        base, arm = row["cells"]
        evals = [[r for r in rows(tmp_path / "sweep" / "mqa" / f"seed{s}") if "val/loss" in r][-1] for s in SEEDS]
        assert arm["values"] == [e[row["metric"]] for e in evals]
        assert arm["verdict"]["status"] in ("decided", "within_noise") and arm["verdict"]["p"] is not None
