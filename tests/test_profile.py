"""Profiler: measured time per module kind covers the measured step, writes a trace, leaves the run unchanged."""

from __future__ import annotations

import json

import pytest
import torch

from gptlab.config.build import build_model, build_optimizer, compose
from gptlab.costs.ops import GROUPS
from gptlab.costs.report import analyze
from gptlab.train.profile.steps import predicted_shares, profile_steps
from gptlab.train.profile.table import format_breakdown
from helpers.model import least_disturbed_profile

TINY = ["model.n_layer=2", "model.d_model=64", "model.n_head=4", "model.block_size=64", "model.vocab_size=128"]
B, T = 4, 64


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _setup(overrides):
    cfg = compose(TINY + overrides)
    torch.manual_seed(0)
    model = build_model(cfg)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 128, (B, T + 1), generator=gen) for _ in range(4)]
    return model, build_optimizer(cfg, model), lambda i: (batches[i][:, :-1], batches[i][:, 1:])


@pytest.mark.parametrize("overrides", [["position=learned", "attention.impl=naive"], ["position=rope", "mlp=swiglu"]])
def test_breakdown_sums_to_measured_step_time(overrides, tmp_path):
    model, optimizer, batch = _setup(overrides)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    predicted = predicted_shares(analyze(model, B, T, mode="train"))
    result = least_disturbed_profile(
        lambda: profile_steps(model, optimizer, batch, steps=2, warmup=1, run_dir=tmp_path, predicted=predicted)
    )
    assert set(result.seconds) == set(GROUPS)
    assert all(v >= 0 for v in result.seconds.values())
    assert 0.90 * result.step_s <= result.attributed_s <= result.step_s  # regions cover >= 90 % of the step
    for kind in ("attention projections", "attention kernel", "mlp", "lm_head", "optimizer"):
        assert result.seconds[kind] > 0, kind
    assert sum(predicted.values()) == pytest.approx(1.0)
    # the trace holds our labelled regions; profile.json holds both shares
    trace = json.loads((tmp_path / "profile_trace.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert "attention kernel:blocks.0.attn" in names and "mlp:blocks.1.mlp.backward" in names
    saved = json.loads((tmp_path / "profile.json").read_text())
    assert saved["predicted_share"] == predicted and saved["step_s"] == pytest.approx(result.step_s)
    # profiling leaves the run as it was: weights restored, every hook removed
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not any(
        m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks for m in model.modules()
    )
    table = format_breakdown(result)
    assert "attention kernel" in table and "step (measured)" in table
