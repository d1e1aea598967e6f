"""The verdict matrix: each lens's cell is the verdict that lens made, matched arms fold into their source's row,
and the reconciled findings follow from the cells alone."""

from __future__ import annotations

import json

import pytest
import yaml

from gptlab.compare import modes
from gptlab.compare.reading.timing import EQUAL_TIME_METRIC
from gptlab.compare.render import json_report
from gptlab.compare.render import matrix as matrix_text
from gptlab.compare.statistics.verdict import Status, Verdict, baseline, difference
from gptlab.compare.tables.matrix import ArmLenses, Finding, Lens, reconcile
from gptlab.compare.tables.timed import not_timed
from tests.helpers.compare import write_run

WORSE = difference("val/loss", [3.10, 3.11, 3.12], [3.00, 3.01, 3.02])
BETTER = difference("val/loss", [2.90, 2.91, 2.92], [3.00, 3.01, 3.02])
NOISE = difference("val/loss", [3.00, 3.05, 2.98], [3.01, 3.00, 3.03])
ONE_SEED = difference("val/loss", [3.1], [3.0, 3.01])
UNRESOLVED = Verdict("val/loss", Status.UNRESOLVED, 0.02, (0.01, 0.03), 0.01, seeds=(3, 3))
FAST = Verdict("tokens_per_s", Status.DECIDED, 1.2, (1.1, 1.3), 0.001, True, (3, 3))
NOT_TIMED = Verdict(EQUAL_TIME_METRIC, Status.NOT_MEASURED)


def arm(cost: float | None = 0.9, **cells: Verdict) -> ArmLenses:
    return ArmLenses("mqa", {Lens(k): v for k, v in cells.items()}, FAST, cost=cost)


def test_the_cells_used_here_are_what_the_tests_say():
    assert (WORSE.direction, BETTER.direction, NOISE.status, ONE_SEED.status) == (
        1,
        -1,
        Status.WITHIN_NOISE,
        Status.NO_TEST,
    )


@pytest.mark.parametrize(
    ("cells", "cost", "findings"),
    [
        ({"equal_steps": WORSE, "equal_flops": WORSE, "equal_training_time": WORSE}, 0.9, [Finding.AGREE]),
        ({"equal_steps": NOISE, "equal_flops": NOISE}, 0.9, [Finding.ALL_NOISE]),
        ({"equal_steps": WORSE, "equal_training_time": BETTER}, 0.9, [Finding.OPPOSITE]),
        # an arm not timed has no equal-training-time reading: its cell decides nothing
        ({"equal_steps": WORSE, "equal_training_time": NOT_TIMED}, 0.9, []),
        # the equal-steps gap vanishes at equal FLOPs only means something when the arms' costs differ
        ({"equal_steps": WORSE, "equal_flops": NOISE}, 0.8, [Finding.NOT_AT_EQUAL_FLOPS]),
        ({"equal_steps": WORSE, "equal_flops": NOISE}, 1.0, []),
        ({"equal_steps": WORSE, "equal_flops": NOISE}, None, []),
        ({"equal_steps": WORSE, "own_best_lr": NOISE}, 1.0, [Finding.NOT_AT_OWN_LR]),
        (
            {"equal_steps": WORSE, "equal_flops": NOISE, "matched": WORSE},
            0.8,
            [Finding.NOT_AT_EQUAL_FLOPS, Finding.HOLDS_MATCHED],
        ),
        ({"equal_steps": WORSE, "equal_flops": UNRESOLVED}, 0.8, [Finding.NEEDS_EVALS]),
        ({"equal_steps": ONE_SEED, "equal_flops": NOISE}, 0.8, [Finding.NEEDS_SEEDS]),
        ({"equal_steps": BETTER, "equal_flops": BETTER, "own_best_lr": BETTER}, 0.8, [Finding.AGREE]),
    ],
)
def test_reconcile_names_where_lenses_agree_and_disagree(cells, cost, findings):
    assert reconcile(arm(cost, **cells)) == findings


def test_the_reconciled_sentence_says_each_outcome_and_its_meaning():
    a = arm(0.8, equal_steps=WORSE, equal_flops=NOISE, matched=WORSE)
    a.matched_arm, a.matched_mode = "mqa matched", "flops"
    a.findings = reconcile(a)
    m = modes.matrix.Matrix("mha", [a], list(a.cells))
    [sentence] = matrix_text.sentences(m)
    assert sentence.startswith("mqa (matched: mqa matched): worse at equal steps and FLOP-matched; within noise at ")
    assert "part of the gap may be compute, not architecture" in sentence
    assert "matched in cost it holds" in sentence and sentence.endswith("; speed faster.")
    assert matrix_text.headers(m) == [
        "arm",
        "Δ val loss at equal steps",
        "Δ val loss at equal FLOPs",
        "Δ val loss at FLOP-matched",
        "speed-up",
    ]
    [row] = matrix_text.body(m)
    assert row[1] == f"+0.1000 [{WORSE.interval[0]:+.4f}, {WORSE.interval[1]:+.4f}] worse"


def test_a_baseline_cell_and_a_missing_lens_read_as_such():
    a = arm(1.0, equal_steps=WORSE)
    m = modes.matrix.Matrix("mha", [a], [Lens.EQUAL_STEPS, Lens.EQUAL_FLOPS])
    assert matrix_text.body(m)[0][2] == "–"
    assert modes.matrix.outcome(baseline("val/loss")).value == "not_measured"
    # a lens no timing session measured reads "not timed", and so does an untimed arm's speed
    untimed = ArmLenses("mqa", {Lens.EQUAL_STEPS: WORSE, Lens.EQUAL_TRAIN_TIME: NOT_TIMED}, not_timed())
    m = modes.matrix.Matrix("mha", [untimed], [Lens.EQUAL_STEPS, Lens.EQUAL_TRAIN_TIME])
    assert matrix_text.body(m)[0][2:] == ["not timed", "not timed"]
    assert matrix_text.sentences(m)[0].endswith("; speed not timed.")


def _seeds(root, name, level, cost, **kw):
    for seed in range(3):
        write_run(
            root / name / f"seed{seed}",
            seed=seed,
            loss_at=lambda s, lv=level, sd=seed: lv + 2.0 * (0.97**s) + 0.002 * sd,
            flops_per_token=cost,
            **kw,
        )


def test_a_matched_arm_folds_into_the_arm_it_was_matched_from(tmp_path):
    """mha (baseline), mqa (cheaper, worse) and mqa re-solved to mha's FLOPs: two matrix rows, not three; the
    matched arm's equal-steps verdict is mqa's FLOP-matched cell, and comparison.json carries the matrix."""
    _seeds(tmp_path, "mha", 1.50, 7.2e5)
    _seeds(tmp_path, "mqa", 1.56, 6.0e5, choices={"attention": "mqa"})
    _seeds(
        tmp_path,
        "mqa_matched",
        1.53,
        7.2e5,
        choices={"attention": "mqa"},
        leaves={"model.match": "flops", "mlp.ratio": 4.8},
    )
    for seed in range(3):
        path = tmp_path / "mqa_matched" / f"seed{seed}" / "summary.json"
        doc = json.loads(path.read_text())
        doc["match"] = {"mode": "flops", "key": "mlp.ratio", "configured": 4, "resolved": 4.8, "residual": 0}
        path.write_text(json.dumps(doc))
    req = modes.Request([str(tmp_path)], baseline="attention=mha", out=str(tmp_path / "cmp"))
    found = modes.tables(req)
    m = found.comparisons[0].matrix
    labels = [r.label for r in found.comparisons[0].rows]
    assert len(labels) == 3 and len(m.arms) == 1
    [mqa] = m.arms
    matched_label = next(x for x in labels if "model.match=flops" in x)
    assert (mqa.label, mqa.matched_arm, mqa.matched_mode) == (
        "attention=mqa, attention.n_kv_head=1",
        matched_label,
        "flops",
    )
    assert mqa.cells[Lens.MATCHED] == found.comparisons[0].rows[labels.index(matched_label)].loss
    assert (
        mqa.cells[Lens.EQUAL_STEPS]
        == found.comparisons[0].rows[labels.index("attention=mqa, attention.n_kv_head=1")].loss
    )
    assert mqa.cost == pytest.approx(6.0 / 7.2)
    assert list(mqa.cells)[:2] == [Lens.EQUAL_STEPS, Lens.EQUAL_FLOPS]
    doc = json_report.comparison(found.comparisons[0])["verdict_matrix"]
    assert doc["arms"][0]["cells"]["matched"]["status"] == mqa.cells[Lens.MATCHED].status.value
    assert doc["lenses"][0] == "equal_steps"


def _matched_sweep(tmp_path, components: dict | None):
    """mha, mqa and mqa re-solved to the FLOPs of the baseline its record names (`components`; None: a record from
    before the baseline was kept), compared against attention=mha."""
    _seeds(tmp_path, "mha", 1.50, 7.2e5)
    _seeds(tmp_path, "mqa", 1.56, 6.0e5, choices={"attention": "mqa"})
    _seeds(tmp_path, "mqa_matched", 1.53, 7.2e5, choices={"attention": "mqa"},
           leaves={"model.match": "flops", "mlp.ratio": 4.8})  # fmt: skip
    for seed in range(3):
        path = tmp_path / "mqa_matched" / f"seed{seed}" / "summary.json"
        doc = json.loads(path.read_text())
        doc["match"] = {"mode": "flops", "key": "mlp.ratio", "configured": 4, "resolved": 4.8, "residual": 0}
        if components is not None:
            doc["match"]["baseline"] = {"match_to": [], "components": components, "is_self": False}
        path.write_text(json.dumps(doc))
    req = modes.Request([str(tmp_path)], baseline="attention=mha", out=str(tmp_path / "cmp"))
    return modes.tables(req)


def _baseline_components(tmp_path) -> dict:
    """The four components of the mha runs' saved config: the baseline the comparison names."""
    cfg = yaml.safe_load((tmp_path / "mha" / "seed0" / ".hydra" / "config.yaml").read_text())
    return {k: cfg[k] for k in ("attention", "mlp", "norm", "position")}


def test_a_matched_arm_reads_against_the_baseline_it_was_matched_to_or_says_it_cannot(tmp_path):
    """The match record names the baseline the arm was sized against. The comparison's baseline is that one (up to
    impl): the matched cell is read. It is another (the record says mlp.ratio 3): no matched cell, one warning naming
    the key. The record does not say (an older run): the cell is read, with a note that it assumes the baseline."""
    first = tmp_path / "same"
    _seeds(first, "mha", 1.50, 7.2e5)
    wanted = _baseline_components(first)
    wanted["attention"] = {**wanted["attention"], "impl": "flash"}  # speed only: still the same baseline
    found = _matched_sweep(first, wanted)
    [mqa] = found.comparisons[0].matrix.arms
    assert Lens.MATCHED in mqa.cells and not any("matched to another" in n.text for n in found.comparisons[0].warnings)

    other = tmp_path / "other"
    _seeds(other, "mha", 1.50, 7.2e5)
    wanted = _baseline_components(other)
    wanted["mlp"] = {**wanted["mlp"], "ratio": 3}
    found = _matched_sweep(other, wanted)
    cmp = found.comparisons[0]
    assert all(Lens.MATCHED not in a.cells for a in cmp.matrix.arms) and len(cmp.matrix.arms) == 2  # its own row
    (said,) = [n for n in cmp.warnings if "matched to another baseline" in n.text]
    assert "differs in mlp.ratio" in said.text and f"than the comparison's '{cmp.baseline}'" in said.text
    assert cmp.compute.other_baseline == {said.subject: ["mlp.ratio"]}

    older = tmp_path / "older"
    found = _matched_sweep(older, None)
    cmp = found.comparisons[0]
    [mqa] = cmp.matrix.arms
    assert Lens.MATCHED in mqa.cells
    assert any("records no baseline it was flops-matched to" in n.text for n in cmp.notes)
