"""Profiler per layer: one row per block index, times that add up to the step, the cost model's per-layer share."""

from __future__ import annotations

import json

import pytest
import torch

from gptlab.config.build import build_model, build_optimizer, compose
from gptlab.costs.ops import GROUPS
from gptlab.costs.report import analyze
from gptlab.train.profile.steps import predicted_layer_shares, predicted_shares, profile_steps
from gptlab.train.profile.table import LAYER_KINDS, format_breakdown
from helpers.model import least_disturbed_profile

TINY = ["model.n_layer=2", "model.d_model=64", "model.n_head=4", "model.block_size=64", "model.vocab_size=128"]
B, T = 4, 64
OUTSIDE_OPS = {"embedding", "position", "norm_f", "lm_head", "loss", "optimizer"}  # cost-model ops not in a block


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A 2-layer tiny GPT profiled for 2 steps, with the cost model's per-kind and per-layer shares."""
    cfg = compose(TINY + ["position=learned", "norm=layernorm"])
    torch.manual_seed(0)
    model = build_model(cfg)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 128, (B, T + 1), generator=gen) for _ in range(3)]
    report = analyze(model, B, T, mode="train")
    run_dir = tmp_path_factory.mktemp("profile")
    optimizer = build_optimizer(cfg, model)
    result = least_disturbed_profile(
        lambda: profile_steps(
            model,
            optimizer,
            lambda i: (batches[i][:, :-1], batches[i][:, 1:]),
            steps=2,
            warmup=1,
            run_dir=run_dir,
            predicted=predicted_shares(report),
            predicted_layers=predicted_layer_shares(report, model),
        )
    )
    return result, report.to_dict(), run_dir


def test_one_row_per_layer_with_positive_times(profiled):
    result, _, _ = profiled
    rows = result.layer_rows()
    assert [r["layer"] for r in rows] == [0, 1]
    for row in rows:
        assert row["total_s"] > 0 and row["total_s"] == pytest.approx(sum(row["seconds"].values()))
        for kind in ("norms", "attention projections", "attention kernel", "mlp"):
            assert row["seconds"][kind] > 0, (row["layer"], kind)
        assert row["seconds"]["embedding"] == row["seconds"]["lm_head"] == row["seconds"]["optimizer"] == 0


def test_layers_and_the_other_kinds_add_up_to_the_step(profiled):
    """Σ layers + time outside every block = time attributed to kinds (exactly), 90-100 % of the measured step."""
    result, _, _ = profiled
    outside = result.outside_layers()
    assert set(outside) == set(GROUPS)
    assert all(v >= -1e-12 for v in outside.values())
    for kind in ("embedding", "lm_head", "optimizer"):
        assert outside[kind] == result.seconds[kind] > 0, kind
    layers = sum(r["total_s"] for r in result.layer_rows())
    assert layers + sum(outside.values()) == pytest.approx(result.attributed_s, rel=1e-9)
    assert 0.90 * result.step_s <= layers + sum(outside.values()) <= result.step_s * (1 + 1e-9)
    for kind in GROUPS:  # each kind's layer parts never exceed its total
        assert sum(layer[kind] for layer in result.layers) <= result.seconds[kind] + 1e-12


def test_predicted_share_per_layer_is_the_block_ops_share(profiled):
    """Two identical blocks: each layer's predicted share = (Σ in-block op time bounds) / 2 / (Σ all op time bounds)."""
    result, report, _ = profiled
    rows = report["ops"]
    total = sum(r["time_lower_bound_s"] for r in rows)
    in_blocks = sum(r["time_lower_bound_s"] for r in rows if r["name"] not in OUTSIDE_OPS)
    assert result.predicted_layers == pytest.approx([in_blocks / 2 / total] * 2, rel=1e-12)
    # the same as the blocks' kinds in the per-kind prediction, minus the final norm
    kinds = result.predicted_share
    norm_f = next(r["time_lower_bound_s"] for r in rows if r["name"] == "norm_f") / total
    loss = next(r["time_lower_bound_s"] for r in rows if r["name"] == "loss") / total
    block_kinds = kinds["attention projections"] + kinds["attention kernel"] + kinds["mlp"] + kinds["norms"] - norm_f
    assert sum(result.predicted_layers) == pytest.approx(block_kinds + kinds["other"] - loss, rel=1e-9)


def test_table_and_profile_json_carry_the_layers(profiled):
    result, _, run_dir = profiled
    text = format_breakdown(result)
    kinds, layers = text.split("\n\n")
    assert all(kind in kinds for kind in GROUPS) and "step (measured)" in kinds
    lines = layers.splitlines()
    assert lines[0].split()[0] == "layer" and [line.split()[0] for line in lines[1:3]] == ["0", "1"]
    assert lines[3].startswith("outside blocks") and len(lines) == 4
    first = lines[1].split()
    assert len(first) == 1 + len(LAYER_KINDS) + 3  # layer, one column per kind, total ms, measured, predicted
    assert float(first[len(LAYER_KINDS) + 1]) == pytest.approx(1e3 * result.layer_rows()[0]["total_s"], abs=0.01)
    assert first[-1] == f"{100 * result.predicted_layers[0]:.1f}%"
    saved = json.loads((run_dir / "profile.json").read_text())
    assert [r["layer"] for r in saved["layers"]] == [0, 1]
    assert saved["layers"][1]["predicted_share"] == pytest.approx(result.predicted_layers[1])
    assert saved["outside_layers_s"]["optimizer"] == pytest.approx(result.seconds["optimizer"])
    names = {e.get("name") for e in json.loads((run_dir / "profile_trace.json").read_text())["traceEvents"]}
    assert {"mlp:blocks.0.mlp", "mlp:blocks.1.mlp", "norms:blocks.1.norm2.backward"} <= names


def test_without_a_per_layer_prediction_the_column_shows_a_dash(profiled):
    result, _, _ = profiled
    from dataclasses import replace

    plain = replace(result, predicted_layers=None)
    layers = format_breakdown(plain).split("\n\n")[1].splitlines()
    assert layers[1].split()[-1] == "-" and layers[3].split()[-1] == "-"
    assert plain.layer_rows()[0]["predicted_share"] is None
