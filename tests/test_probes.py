"""Capability probes (gptlab/train/probes/): correct on hand-built models (a perfect copier scores 1.0, a model that
knows nothing scores chance and ln(V)), fixed sets that depend only on data_seed, position=learned measured at 1x
only, bad keys refused in one line, a real run logs probe/* rows (metrics.jsonl, summary.json, W&B) without changing
its curve, and gptlab-compare puts them in a table with seed statistics."""

from __future__ import annotations

import json
import logging
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gptlab.config import build
from gptlab.data.lm import LMData
from gptlab.errors import ConfigError
from gptlab.runtime.hardware import Hardware
from gptlab.train.probes.induction import InductionProbe
from gptlab.train.probes.length import LengthProbe
from gptlab.train.probes.recall import RecallProbe, bucket, key_distance
from gptlab.train.probes.score import measure_probes
from helpers.train import FAST, rows, run_inprocess

V, T = 65, 64
CPU = Hardware(device="cpu", dtype="fp32")


class Copier(torch.nn.Module):
    """At each position, a one-hot logit on the token that followed the previous occurrence of this token
    (uniform where it has none): perfect induction, and perfect recall since a query repeats its key."""

    def forward(self, idx, targets=None):
        B, L = idx.shape
        logits = torch.zeros(B, L, V)
        for b in range(B):
            seen: dict[int, int] = {}  # token -> its latest position
            for t in range(L):
                tok = int(idx[b, t])
                if tok in seen:
                    logits[b, t, int(idx[b, seen[tok] + 1])] = 10.0
                seen[tok] = t
        return logits, _loss(logits, targets)


class Noise(torch.nn.Module):
    """Logits that ignore the input: exactly uniform (`flat`), else random from a fixed generator."""

    def __init__(self, flat: bool):
        super().__init__()
        self.flat, self.gen = flat, torch.Generator().manual_seed(0)

    def forward(self, idx, targets=None):
        shape = (*idx.shape, V)
        logits = torch.zeros(shape) if self.flat else torch.randn(shape, generator=self.gen)
        return logits, _loss(logits, targets)


def _loss(logits, targets):
    return None if targets is None else F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-100)


class Tok:
    name, vocab_size = "ids", V

    def identity(self):
        return "ids"


def text_data(seed: int = 1) -> LMData:
    """A real LMData over random ids (vocabulary V, training length T), for the length probe."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, V, 20_000).astype(np.uint16)
    return LMData(name="ids", tokenizer=Tok(), train=tokens, val=tokens, seed=seed, block_size=T, fingerprint="ids")


def test_a_perfect_copier_scores_one_on_induction_and_on_recall_at_every_pair_count_and_distance():
    data = SimpleNamespace(vocab_size=V, seq_len=T, name="ids")
    probes = [RecallProbe(seed=5, data=data), InductionProbe(seed=5, data=data)]
    got, seconds = measure_probes(probes, Copier(), CPU, tokens_per_forward=512)
    assert got["probe/induction/acc"] == 1.0
    recall = {k: v for k, v in got.items() if k.startswith("probe/recall/")}
    assert set(recall) >= {f"probe/recall/pairs{p:02d}/acc" for p in (2, 4, 8, 16)} | {"probe/recall/acc"}
    assert any("/dist32-63/" in k for k in recall) and all(v == 1.0 for v in recall.values())
    assert seconds > 0


def test_a_model_that_knows_nothing_scores_chance_and_ln_vocab():
    data = text_data()
    probes = [RecallProbe(seed=5, data=data), InductionProbe(seed=5, data=data), LengthProbe(seed=5, data=data)]
    got, _ = measure_probes(probes, Noise(flat=False), CPU, tokens_per_forward=512)
    for key, scored in (
        ("probe/recall/acc", sum(len(s[1][s[1] != -100]) for s in probes[0].sets.values())),
        ("probe/induction/acc", int((probes[1].y != -100).sum())),
    ):
        sd = math.sqrt((1 / V) * (1 - 1 / V) / scored)  # binomial spread of chance accuracy
        assert abs(got[key] - 1 / V) < 4 * sd, (key, got[key], scored)
    flat, _ = measure_probes(probes[2:], Noise(flat=True), CPU, tokens_per_forward=512)
    assert set(flat) == {"probe/length/1x/loss", "probe/length/2x/loss", "probe/length/4x/loss"}
    assert all(v == pytest.approx(math.log(V), rel=1e-6) for v in flat.values())  # fp32 logits


def test_recall_distance_and_buckets():
    x = torch.tensor([[3, 7, 4, 8, 4, 8, 3, 7]])  # k3 v7 k4 v8 | q4 a8 q3 a7
    assert key_distance(x).tolist() == [[0, 0, 0, 0, 2, 2, 6, 6]]
    assert [bucket(d, 2) for d in (2, 3, 6, 17)] == ["dist02-03", "dist02-03", "dist04-07", "dist16-31"]


def _sets(*overrides: str):
    cfg = build.compose([*FAST, "probes=[recall,induction,length]", *overrides])
    data = build.build_data(cfg, int(cfg.model.block_size))
    torch.manual_seed(int(cfg.seed))
    model = build.build_model(cfg, vocab_size=data.vocab_size)
    return build.build_probes(cfg, data, model), data.vocab_size


def _tensors(probes) -> list[torch.Tensor]:
    recall, induction, length = probes
    return [t for s in recall.sets.values() for t in s] + [induction.x, induction.y, length.x, length.y]


def test_the_fixed_sets_depend_on_data_seed_only_never_on_the_model_or_its_seed():
    base, _ = _sets()
    for other, _ in (
        _sets("position=alibi", "seed=3"),
        _sets("attention=gqa", "attention.n_kv_head=2", "mlp=swiglu", "seed=7"),
        _sets("position=learned"),  # measures 1x only, on the same set
    ):
        assert [p.fingerprint for p in other] == [p.fingerprint for p in base]
        assert all(torch.equal(a, b) for a, b in zip(_tensors(other), _tensors(base)))
    moved, _ = _sets("data_seed=7")
    assert all(a.fingerprint != b.fingerprint for a, b in zip(moved, base))


def test_learned_positions_measure_1x_only_and_say_so_in_one_line(caplog):
    from gptlab.model.gpt import GPT

    with caplog.at_level(logging.WARNING, logger="gptlab.train.probes.length"):
        probes, vocab = _sets("position=learned")
    (probe,) = [p for p in probes if p.name == "length"]
    (line,) = [r.getMessage() for r in caplog.records if "probes.length" in r.getMessage()]
    assert "model.block_size=64" in line and "only 1x is measured (not 2x, 4x)" in line and "\n" not in line
    assert probe.factors == [1]
    cfg = build.compose([*FAST, "position=learned"])
    learned = build.build_model(cfg, vocab_size=vocab)
    got, _ = measure_probes([probe], learned, CPU, 512)
    assert list(got) == ["probe/length/1x/loss"] and math.isfinite(got["probe/length/1x/loss"])
    with pytest.raises(ValueError, match="exceeds model.block_size=64"):  # why: its table ends at block_size
        learned(torch.zeros(1, 2 * T, dtype=torch.long))
    rope: GPT = build.build_model(build.compose(FAST), vocab_size=vocab)  # the same model trained at T, run at 4T
    rope.eval()
    with torch.no_grad():
        short, _ = rope(probe.x[:, :T])
        long, _ = rope(probe.x)
    assert torch.allclose(long[:, :T], short, atol=1e-5)  # causal: the first T positions see what they saw at T


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["probes=[recall]", "probes.recall.queries=0"], "probes.recall.queries=0: must be >= 1"),
        (["probes=[recall]", "+probes.recall.querys=3"], "probes.recall.querys: not a key of this probes.recall"),
        (["probes=[length]", "probes.length.factors=[1,3,4]"], "each must divide the largest (4)"),
        (["probes=[length]", "data=assoc_recall"], "probes.length: needs a text data choice"),
    ],
)
def test_bad_probe_input_is_one_line_before_anything_is_written(tmp_path, overrides, needle):
    with pytest.raises(ConfigError) as err:
        run_inprocess(tmp_path / "r", *overrides, steps=2, eval_interval=2)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


SMALL = ["probes.recall.queries=16", "probes.induction.sequences=4", "probes.length.windows=1"]


@pytest.mark.slow
def test_a_real_run_logs_probes_and_compare_reports_them_with_seed_statistics(tmp_path, capsys):
    from gptlab.cli.compare import main
    from gptlab.compare.statistics.stats import welch_test
    from helpers.wandb_read import history, inspect_records

    sweep = tmp_path / "sweep"
    probes = ["probes=[recall,induction,length]", *SMALL]
    for arm, position in (("rope", "rope"), ("alibi", "alibi")):
        for seed in (0, 1):
            logger = ["logger=wandb"] if (arm, seed) == ("rope", 0) else []
            run_inprocess(
                sweep / arm / f"seed{seed}",
                *probes,
                f"position={position}",
                f"seed={seed}",
                *logger,
                steps=2,
                eval_interval=2,
            )
    run_inprocess(tmp_path / "plain", "seed=0", steps=2, eval_interval=2)
    run = sweep / "rope" / "seed0"
    evals = [r for r in rows(run) if "val/loss" in r]
    assert [r["step"] for r in evals] == [0, 2]
    keys = {k for k in evals[-1] if k.startswith("probe/")}
    assert {"probe/recall/acc", "probe/induction/acc", "probe/length/4x/loss"} <= keys and evals[-1][
        "perf/probe_ms"
    ] > 0
    summary = json.loads((run / "summary.json").read_text())
    assert {k: summary[k] for k in keys} == {k: evals[-1][k] for k in keys} and summary["probe_s"] > 0
    assert set(summary["probe_sets"]) == {"recall", "induction", "length"}
    curve = lambda d: [(r["step"], r.get("train/loss"), r.get("val/loss")) for r in rows(d)]  # noqa: E731
    assert curve(run) == curve(tmp_path / "plain")  # probes only observe: the curve is bit-identical
    (offline,) = sorted((run / "wandb").glob("offline-run-*"))
    logged = [h for h in history(inspect_records(offline)) if "probe/induction/acc" in json.dumps(h)]
    assert logged, "probe/* keys missing from the W&B history"

    assert main([str(sweep), "--out", str(tmp_path / "out"), "--no-wandb", "--baseline", "position=rope"]) == 0
    capsys.readouterr()
    doc = json.loads((tmp_path / "out" / "comparison.json").read_text())
    row = next(r for r in doc["probes"] if r["metric"] == "probe/length/1x/loss")
    base, other = row["cells"]
    per_arm = {
        a: [next(r for r in reversed(rows(sweep / a / f"seed{s}")) if "val/loss" in r) for s in (0, 1)]
        for a in ("rope", "alibi")
    }
    assert base["values"] == [e["probe/length/1x/loss"] for e in per_arm["rope"]]
    assert other["verdict"]["p"] == pytest.approx(welch_test(other["values"], base["values"]).p)
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "## Probes" in md and "| probe/length/1x/loss |" in md and "Probe table:" in md
    assert "Probes</h2>" in (tmp_path / "out" / "comparison.html").read_text()
    assert len(doc["rows"]) == 2  # probes never split an arm: rope and alibi, two seeds each


def test_the_probe_table_has_the_val_loss_statistics_and_never_pools_different_sets():
    from types import SimpleNamespace as NS

    from gptlab.compare.render import markdown, per_arm, words
    from gptlab.compare.render.sections import Document
    from gptlab.compare.statistics.stats import welch_interval, welch_test
    from gptlab.compare.tables.probes import probe_rows

    def run(values: dict, sets: dict):
        return NS(path=str(values), by_step={100: values}, summary={"probe_sets": sets})

    same = {"induction": "induction:aa", "length": "length:bb"}
    base = [run({"probe/induction/acc": a, "probe/length/1x/loss": 3.0, "probe/length/2x/loss": 3.1}, same)
            for a in (0.50, 0.52, 0.54)]  # fmt: skip
    learned = [run({"probe/induction/acc": a, "probe/length/1x/loss": 2.9}, same) for a in (0.70, 0.71, 0.72)]
    other = [run({"probe/induction/acc": 0.9}, {"induction": "induction:cc"})]  # another set: never pooled
    point = NS(step_of=lambda r: 100)
    rows, warnings = probe_rows([NS(runs=base), NS(runs=learned)], ["rope", "learned"], point)
    induction = next(r for r in rows if r.metric == "probe/induction/acc")
    cell = induction.cells[1]
    a, b = [0.70, 0.71, 0.72], [0.50, 0.52, 0.54]
    assert cell.delta == pytest.approx(0.19) and cell.verdict.p == pytest.approx(welch_test(a, b).p)
    assert cell.verdict.interval == pytest.approx((welch_interval(a, b, 0.05).lo, welch_interval(a, b, 0.05).hi))
    assert cell.verdict.decided and warnings == []
    table = per_arm.table(per_arm.PROBES, [(r.metric, r.better, r.cells) for r in rows])
    text = "\n".join(markdown.block(table))
    assert "| probe/induction/acc | 0.5200 ± 0.0200 | 0.7100 ± 0.0100 Δ +0.1900 better (p=" in text
    assert "| probe/length/2x/loss | 3.1000 ± 0.0000 | – |" in text  # learned: 1x only, no made-up 2x
    assert "| probe/length/1x/loss | 3.0000 ± 0.0000 | 2.9000 ± 0.0000 Δ -0.1000 better (p=0) |" in text  # lower loss
    # the W&B comparison run logs the same table (columns and cells as the report's)
    from gptlab.compare.render.wandb_log import report_tables

    logged = report_tables(Document("probes", "", (table,)))
    assert set(logged) == {"probes"} and logged["probes"].columns == ["probe", "rope", "learned"]
    assert logged["probes"].data == [list(row) for row in table.rows]
    rows, warnings = probe_rows([NS(runs=base), NS(runs=other)], ["rope", "other"], point)
    assert "probe/induction/acc" not in {r.metric for r in rows}
    assert [words.note(w) for w in warnings] == [
        "warning: probe/induction/acc: the runs measured it on different fixed sets (induction:aa, induction:cc; "
        "summary.json probe_sets), so it is left out of the probe table"
    ]
    assert warnings[0].subject == "probe/induction/acc"


@pytest.mark.slow
def test_a_resumed_run_keeps_its_probes_and_refuses_other_ones(tmp_path):
    run = tmp_path / "r"
    args = ["probes=[induction]", "probes.induction.sequences=2", "schedule=constant", "schedule.warmup_steps=0"]
    run_inprocess(run, *args, steps=2, eval_interval=2)
    summary = run_inprocess(run, *args, steps=4, eval_interval=2)  # train.resume=auto: continues to step 4
    evals = [r for r in rows(run) if "val/loss" in r]
    assert [r["step"] for r in evals] == [0, 2, 4] and all("probe/induction/acc" in r for r in evals)
    assert summary["probe/induction/acc"] == evals[-1]["probe/induction/acc"]
    with pytest.raises(ConfigError, match="probes"):
        run_inprocess(run, "probes=[recall]", *args[2:], steps=6, eval_interval=2)
