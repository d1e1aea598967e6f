"""model.match: every mlp and attention choice in conf/ matched to the baseline's params or training FLOPs/token within
one rounding step, checked on the real built model (sum of p.numel(), costs.report.train_flops_per_token) and against
the knob's neighbouring values; the one-line refusals; the record in summary.json and provenance.json."""

from __future__ import annotations

import json

import pytest

from gptlab.config.build import build_model, compose, matched
from gptlab.costs.report import train_flops_per_token
from gptlab.errors import ConfigError
from gptlab.util.paths import CONF_DIR
from helpers.train import rows, run_inprocess

MLPS = sorted(p.stem for p in (CONF_DIR / "mlp").glob("*.yaml"))
ATTENTIONS = sorted(p.stem for p in (CONF_DIR / "attention").glob("*.yaml"))
SMALL = ["model.n_layer=4", "model.d_model=64", "model.n_head=4", "model.block_size=64"]
VOCAB = 65


def _true_cost(overrides: list[str], mode: str) -> float:
    """The built model's own figure: non-embedding sum(p.numel()), or the cost model's FLOPs/token of the full GPT."""
    cfg = compose([*SMALL, *overrides])
    model = build_model(cfg, vocab_size=VOCAB, device="meta")
    if mode == "flops":
        return train_flops_per_token(model, int(cfg.model.block_size))
    embedding = model.wte.weight.numel() + sum(p.numel() for p in model.position.parameters())
    return sum(p.numel() for p in model.parameters()) - embedding


def _neighbour(record: dict, d_model: int, n_head: int, delta: int) -> str:
    """The knob one grid step away from the resolved value, as an override."""
    if record["knob"] == "mlp":
        return f"mlp.ratio={(round(record['resolved'] * d_model) + delta) / d_model!r}"
    step = 2 * n_head if record["knob"] == "d_model" else 1
    return f"{record['key']}={record['resolved'] + delta * step}"


CASES = [(m, "mha") for m in MLPS] + [("gelu", a) for a in ATTENTIONS if a != "mha"]


@pytest.mark.parametrize("mode", ["params", "flops"])
@pytest.mark.parametrize("mlp,attention", CASES)
def test_match_hits_the_baseline_within_one_rounding_step(mlp, attention, mode):
    knob = "d_model" if mlp == "none" else "mlp"  # mlp=none has no hidden width
    arm = [f"mlp={mlp}", f"attention={attention}"]
    cfg = compose([*SMALL, *arm, f"model.match={mode}", f"model.match_knob={knob}"])
    _, record = matched(cfg, VOCAB)
    base = _true_cost([], mode)  # the baseline: conf/train.yaml's defaults (mha, gelu, rmsnorm, rope)
    assert record["target"] == pytest.approx(base, rel=1e-12)
    resolved = [*arm, f"{record['key']}={record['resolved']!r}"]
    got = _true_cost(resolved, mode)  # the real model built from the resolved knob agrees with the record
    assert got == pytest.approx(record["achieved"], rel=1e-12)
    assert record["residual"] == pytest.approx(got - base, abs=1e-6)
    # nearest on the knob's grid: neither neighbour is closer, and the baseline lies between them
    below = _true_cost([*arm, _neighbour(record, 64, 4, -1)], mode)
    above = _true_cost([*arm, _neighbour(record, 64, 4, +1)], mode)
    assert below <= base <= above
    assert abs(got - base) <= min(abs(below - base), abs(above - base)) + 1e-6
    assert record["step"] is None or abs(got - base) <= record["step"]
    if mlp == "gelu" and attention == "mha":
        assert record["residual"] == 0 and record["baseline"]["is_self"]


def test_swiglu_match_params_is_the_special_case_at_its_own_rounding():
    """mlp.match_params (2/3 of the width, rounded up to multiple_of) and model.match=params agree within its step."""
    old = _true_cost(["mlp=swiglu", "mlp.match_params=true"], "params")
    cfg = compose([*SMALL, "mlp=swiglu", "mlp.match_params=false", "mlp.multiple_of=1", "model.match=params"])
    _, record = matched(cfg, VOCAB)
    assert record["step"] == 3 * 64 * 4  # one hidden unit: 3 matrices of d_model, 4 layers
    assert abs(record["residual"]) <= record["step"] / 2
    assert abs(old - record["target"]) <= 64 * 3 * 64 * 4  # match_params is within one multiple_of step


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["mlp=none", "model.match=params"], "model.match_knob=mlp: this mlp choice (NoMLP) has no hidden width"),
        (["mlp.ratio=2", "model.match=params"], "re-solves this arm into its baseline"),
        (["mlp.ratio=64", "model.match=params", "model.match_knob=n_layer"], "no model.n_layer in [1, 64] gives"),
        (["model.match=params", 'model.match_to=["model.d_model=3"]'], "model.match_to: 'model.d_model=3' is not"),
        (["model.match=params", 'model.match_to=["mlp=nonesuch"]'], "Could not find 'mlp/nonesuch'"),
        (["model.match=maybe"], "model.match: 'maybe' is not allowed; allowed: null, params, flops"),
    ],
)
def test_impossible_matches_are_refused_in_one_line(overrides, message):
    from gptlab.config.validate import validate

    with pytest.raises(ConfigError) as err:
        validate(compose([*SMALL, "logger=none", *overrides]))
    assert message in str(err.value) and "\n" not in str(err.value)


HYBRID = ["attention=hybrid", "attention.window=16", "model.match=params", "model.match_knob=n_layer"]
TOO_FEW = (
    "model.match=params: no model.n_layer in [1, 64] gives the baseline's 197,184 non-embedding params (the smallest "
    "that builds gives {got} non-embedding params; below it, model.n_layer={n} {what}); allowed: another "
    "model.match_knob, or an arm nearer the baseline"
)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["attention.global_every=null", "attention.global_layers=[3]", "mlp.ratio=12"],
            TOO_FEW.format(
                got="459,328",
                n=3,
                what="leaves no global layer (attention.global_layers=[3]): sliding-window attention in every layer",
            ),
        ),
        (
            ["mlp.ratio=12"],  # hybrid's own global_every=4
            TOO_FEW.format(
                got="459,328",
                n=3,
                what="leaves no global layer (attention.global_every=4): sliding-window attention in every layer",
            ),
        ),
        (
            ["attention.global_every=null", "attention.global_layers=[0,1]", "mlp.ratio=8"],
            TOO_FEW.format(
                got="246,208", n=2, what="makes every layer global (attention.global_layers=[0, 1]): full attention"
            ),
        ),
    ],
)
def test_a_depth_match_never_drops_a_hybrids_global_layers(overrides, message):
    """model.match_knob=n_layer on attention=hybrid: a depth that leaves no global layer (a sliding-window model
    labelled hybrid) or makes every layer global is not chosen; where only such depths reach the baseline, refused."""
    from gptlab.config.validate import validate

    with pytest.raises(ConfigError) as err:
        validate(compose([*SMALL, "logger=none", *HYBRID, *overrides]))
    assert str(err.value) == message


def test_a_depth_match_that_keeps_a_hybrids_global_layers_is_chosen():
    cfg = compose([*SMALL, *HYBRID, "attention.global_every=2", "mlp.ratio=6"])
    _, record = matched(cfg, VOCAB)
    model = build_model(cfg, vocab_size=VOCAB, device="meta")
    windows = [block.attn.window for block in model.blocks]
    assert record["resolved"] == 3 and windows == [16, None, 16]


def test_match_to_names_the_baseline_and_the_knob_can_be_d_model():
    """An mlp_ratio arm matched on d_model to GPT-2 blocks (layernorm, learned positions) named by match_to."""
    blocks = ["norm=layernorm", "position=learned"]
    cfg = compose([*SMALL, *blocks, "mlp.ratio=2", "model.match=params", "model.match_knob=d_model",
                   'model.match_to=["norm=layernorm","position=learned"]'])  # fmt: skip
    _, record = matched(cfg, VOCAB)
    assert record["target"] == _true_cost(blocks, "params")
    assert record["knob"] == "d_model" and record["resolved"] > 64 and record["resolved"] % 8 == 0
    assert abs(record["residual"]) <= record["step"] / 2


def test_a_matched_run_records_its_knob_and_residual(tmp_path):
    """summary.json and provenance.json carry the record; the trained model is the resolved one; every eval row
    carries the cumulative training FLOPs."""
    summary = run_inprocess(tmp_path / "run", "attention=mqa", "model.match=params", steps=2, eval_interval=1)
    evals = [r for r in rows(tmp_path / "run") if "val/loss" in r]
    assert [r["flops"] for r in evals] == [r["tokens"] * summary["flops_per_token"] for r in evals]
    assert [r["tokens"] for r in evals] == [0, 512, 1024]
    record = summary["match"]
    assert record["knob"] == "mlp" and record["mode"] == "params"
    assert summary["params_non_embedding"] == record["achieved"]
    assert abs(record["residual"]) <= record["step"] / 2
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())["match"]
    assert on_disk["resolved"] == record["resolved"]
    assert json.loads((tmp_path / "run" / "provenance.json").read_text())["match"]["residual"] == record["residual"]


def test_a_checkpoint_from_before_the_match_keys_resumes():
    """The keys' defaults equal their absence, so a run saved before they existed is the same config."""
    from gptlab.config.build import plain_config
    from gptlab.config.schema import curve_free_keys
    from gptlab.state.resume import differences

    now = plain_config(compose(SMALL))
    free = curve_free_keys(compose(SMALL))
    before = {**now, "model": {k: v for k, v in now["model"].items() if not k.startswith("match")}}
    assert differences({"config": before}, {"config": now}, free) == []
    matched_now = plain_config(compose([*SMALL, "model.match=params"]))
    assert differences({"config": before}, {"config": matched_now}, free) == ["model.match=<absent> there, params here"]
