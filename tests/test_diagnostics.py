"""Training diagnostics (gptlab/train/diagnostics.py, gptlab/train/anomaly.py): every key for every layer in metrics.jsonl and the
offline W&B run, the groups' grad norms combine to the global one, the curve is untouched, attention statistics match
hand-computed values, an injected spike is found and replayable, an injected NaN is traced to its module."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch

from gptlab.config import build
from gptlab.errors import TrainingDiverged
from gptlab.train.diagnostics import Diagnostics, group_of
from helpers.cli import run_cli
from helpers.train import FAST, rows, run_inprocess, train_env
from helpers.wandb_read import inspect_records

GROUPS = ("attn", "mlp", "norm")


def expected_keys(n_layer: int) -> set[str]:
    keys = {f"diag/{g}/{f}" for g in ("embed", "final") for f in ("grad_norm", "param_norm", "update_ratio")}
    for i in range(n_layer):
        keys |= {f"diag/layer{i:02d}/{g}/{f}" for g in GROUPS for f in ("grad_norm", "param_norm", "update_ratio")}
        keys |= {
            f"diag/layer{i:02d}/attn/max_logit",
            f"diag/layer{i:02d}/attn/entropy",
            f"diag/layer{i:02d}/block/act_rms",
        }
    return keys


def train_rows(run_dir: Path) -> list[dict]:
    return [r for r in rows(run_dir) if "train/loss" in r]


def test_every_key_for_every_layer_and_the_norms_combine_to_the_global_one(tmp_path):
    run_inprocess(tmp_path / "d", "train.diagnostics=true", "train.log_interval=2", "model.n_layer=3", steps=6)
    logged = train_rows(tmp_path / "d")
    assert [r["step"] for r in logged] == [2, 4, 6]
    for r in logged:
        assert {k for k in r if k.startswith("diag/")} == expected_keys(3)
        assert all(math.isfinite(r[k]) for k in expected_keys(3))
        groups = {k for k in r if k.endswith("/grad_norm") and k.startswith("diag/")}
        combined = math.sqrt(sum(r[k] ** 2 for k in groups))  # every parameter is in exactly one group
        assert combined == pytest.approx(r["train/grad_norm"], rel=1e-5)
        assert all(0 < r[k] < 1 for k in r if k.endswith("/update_ratio")) and r["perf/diag_ms"] > 0
        assert all(r[f"diag/layer{i:02d}/attn/entropy"] >= 0 for i in range(3))


def test_diagnostics_leave_the_curve_bit_identical(tmp_path):
    run_inprocess(tmp_path / "off", steps=6)
    run_inprocess(tmp_path / "on", "train.diagnostics=true", "train.spike_factor=1.5", steps=6)
    curve = lambda d: [(r["step"], r.get("train/loss"), r.get("val/loss")) for r in rows(d)]  # noqa: E731
    assert curve(tmp_path / "on") == curve(tmp_path / "off")


def test_attention_statistics_match_hand_computed_values():
    """q = k = 0 makes every allowed score 0: max logit 0, and query i's entropy is log(#keys it sees)."""
    cfg = build.compose([*FAST, "model.n_layer=2", "attention.window=5", "attention.global_every=2"])
    model = build.build_model(cfg, vocab_size=65, device="cpu")
    for block in model.blocks:
        torch.nn.init.zeros_(block.attn.qkv.weight)
    hardware = build.build_hardware(cfg)
    stats = Diagnostics(model, hardware).probe(torch.randint(0, 65, (2, 64)))
    windowed = sum(math.log(min(i + 1, 5)) for i in range(64)) / 64  # layer 0: window 5
    full = sum(math.log(i + 1) for i in range(64)) / 64  # layer 1: global (every 2nd layer)
    assert stats["diag/layer00/attn/max_logit"] == 0 and stats["diag/layer01/attn/max_logit"] == 0
    assert stats["diag/layer00/attn/entropy"] == pytest.approx(windowed, rel=1e-5)
    assert stats["diag/layer01/attn/entropy"] == pytest.approx(full, rel=1e-5)


def test_group_names():
    assert group_of("blocks.3.attn.qkv.weight", 12) == "layer03/attn"
    assert group_of("blocks.3._orig_mod.norm2.weight", 12) == "layer03/norm"
    assert group_of("blocks.10.mlp.up.weight", 120) == "layer010/mlp"
    assert group_of("position.wpe.weight", 12) == "embed" and group_of("norm_f.weight", 12) == "final"


def poison(monkeypatch, module_of, change, from_call: int, until_call: int | None = None) -> None:
    """Every model gptlab builds gets a forward hook on module_of(model) that applies `change` to its output on the
    from_call-th to until_call-th training forwards (counted from 1): an injected fault, deterministic."""
    real_build, calls = build.build_model, []

    def poisoned(cfg, **kw):
        model = real_build(cfg, **kw)

        def hook(module, args, out):
            if module.training:
                calls.append(1)
                if from_call <= len(calls) <= (until_call or len(calls)):
                    return change(out)

        module_of(model).register_forward_hook(hook)
        return model

    monkeypatch.setattr(build, "build_model", poisoned)


def test_an_injected_spike_is_an_event_and_its_batch_replays(tmp_path, monkeypatch, caplog):
    """Training step 11 (row 12) runs with its final norm's output x 40: the logits blow up, so does the loss."""
    poison(monkeypatch, lambda m: m.norm_f, lambda out: out * 40, from_call=12, until_call=12)
    with caplog.at_level(logging.WARNING, logger="gptlab.train.diagnostics"):
        run_inprocess(
            tmp_path / "s",
            "train.spike_factor=1.5",
            "train.spike_dump=true",
            "train.log_interval=5",
            steps=15,
            eval_interval=15,
        )
    events = [r for r in rows(tmp_path / "s") if "spike/loss" in r]
    assert [r["step"] for r in events] == [12]
    event = events[0]
    assert event["spike/ratio"] > 1.5 and event["spike/loss"] == pytest.approx(
        event["spike/ratio"] * event["spike/median"]
    )
    assert event["spike/layers"].count(" x") == 3  # the three groups whose grad norm rose most
    named = [part.rsplit(" x", 1) for part in event["spike/layers"].split(", ")]
    ratios = [float(r) for _, r in named]
    assert ratios == sorted(ratios, reverse=True) and ratios[-1] > 10  # grad norms far above their own medians
    assert all(g in ("embed", "final") or g.split("/")[1] in GROUPS for g, _ in named)
    assert any("loss spike at step 12" in r.getMessage() for r in caplog.records)
    dump = torch.load(event["spike/dump"], weights_only=True)
    assert (dump["step"], dump["first_sample"], dump["count"]) == (12, 88, 8)
    cfg = build.compose([*FAST, "train.max_steps=15"])
    x, y = build.build_data(cfg, block_size=64).train_samples(88, 8)  # a pure function of the step: exact replay
    assert torch.equal(dump["x"], x) and torch.equal(dump["y"], y)


def test_detect_anomaly_names_the_first_module_that_went_nan(tmp_path, monkeypatch, caplog):
    """blocks.1.mlp outputs NaN from the 4th training forward on (injected, deterministic)."""
    poison(monkeypatch, lambda m: m.blocks[1].mlp, lambda out: out * float("nan"), from_call=4)
    with caplog.at_level(logging.WARNING, logger="gptlab.train.diagnostics"), pytest.raises(TrainingDiverged):
        run_inprocess(tmp_path / "a", "train.detect_anomaly=true", steps=6)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("anomaly at step"))
    trace = tmp_path / "a" / "diagnostics" / "anomaly_step_0000004.txt"
    assert line.startswith("anomaly at step 4: forward: first non-finite output from blocks.1.mlp (")
    assert line.endswith(f"; trace: {trace}") and trace.is_file()
    assert trace.read_text().startswith("forward: first non-finite output from blocks.1.mlp")


@pytest.mark.slow
def test_diagnostics_reach_the_offline_wandb_run(tmp_path):
    run = tmp_path / "w"
    proc = run_cli(
        "gptlab.cli.train",
        *[a for a in FAST if a != "logger=none"],
        "logger=wandb",
        "train.diagnostics=true",
        "train.max_steps=2",
        "train.eval_interval=2",
        "train.log_interval=2",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
        env=train_env(),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (offline,) = sorted((run / "wandb").glob("offline-run-*"))
    text = json.dumps(inspect_records(offline))
    local = train_rows(run)[-1]
    for key in expected_keys(2):
        assert json.dumps(key) in text, key
    assert json.dumps(local["diag/layer01/attn/max_logit"])[:8] in text  # the value itself, not only the key


def test_sinusoidal_position_is_the_fixed_formula_with_no_parameters():
    from gptlab.errors import ConfigError
    from gptlab.model.position.sinusoidal import SinusoidalPosition

    pos = SinusoidalPosition(d_model=8, n_head=2, head_dim=4, block_size=16)
    table = pos.table(torch.arange(16), torch.float32)  # (16, 8)
    p, i = 5, 2  # dims 2i, 2i+1 at position p: sin/cos of p / 10000^(2i/d)
    angle = p / 10000 ** (2 * i / 8)
    assert table[p, 2 * i].item() == pytest.approx(math.sin(angle)) and table[p, 2 * i + 1].item() == pytest.approx(
        math.cos(angle)
    )
    assert torch.equal(table[0], torch.tensor([0.0, 1.0] * 4))
    assert list(pos.parameters()) == [] and list(pos.state_dict()) == []
    x = torch.zeros(3, 16, 8)
    assert pos.scale == 0.02  # beside std-0.02 token embeddings, as Vaswani's √d_model-scaled ones beside ±1
    assert torch.equal(pos.embed(x, torch.arange(16)), (0.02 * table).expand(3, 16, 8))
    raw = SinusoidalPosition(d_model=8, n_head=2, head_dim=4, block_size=16, scale=1.0)
    assert torch.equal(raw.embed(x, torch.arange(16)), table.expand(3, 16, 8))
    with pytest.raises(ConfigError, match="position=sinusoidal needs an even model.d_model"):
        SinusoidalPosition(d_model=7, n_head=1, head_dim=7, block_size=16)
    with pytest.raises(ConfigError, match=r"^position.scale=0.0 must be > 0 \(the table's amplitude; 1.0 = the raw"):
        SinusoidalPosition(d_model=8, n_head=2, head_dim=4, block_size=16, scale=0.0)


def test_compare_shows_the_max_logit_with_and_without_qk_norm(tmp_path, capsys):
    """Two real short runs, QK-norm off and on, with diagnostics: the report draws each arm's per-layer curves side by
    side and its note gives each arm's largest max logit, the very values metrics.jsonl holds."""
    from gptlab.cli.compare import main

    sweep = tmp_path / "sweeps" / "qk"
    for arm, qk in (("plain", "false"), ("qk", "true")):
        run_inprocess(
            sweep / arm / "seed0",
            "train.diagnostics=true",
            f"attention.qk_norm={qk}",
            "optimizer.lr=0.01",
            steps=8,
            eval_interval=8,
        )
    assert main([str(sweep), "--out", str(tmp_path / "out"), "--no-wandb"]) == 0
    capsys.readouterr()
    html = (tmp_path / "out" / "comparison.html").read_text()
    assert "layers attn max logit" in html and (tmp_path / "out" / "layers_attn_max_logit.png").is_file()
    md = (tmp_path / "out" / "comparison.md").read_text()
    note = next(line for line in md.splitlines() if line.startswith("- max attention logit"))
    for arm in ("plain", "qk"):
        last = train_rows(sweep / arm / "seed0")[-1]
        top = max((last[f"diag/layer{i:02d}/attn/max_logit"], f"layer{i:02d}") for i in range(2))
        assert f"{top[0]:.3g} ({top[1]})" in note, (arm, note)


def test_diagnostics_time_leaves_out_the_wait_for_the_steps_gpu_work(monkeypatch):
    """The GPU is mocked (none here). Step time on CUDA is the device's time between the step's marks minus the
    diagnostics' own host time; their first read back (a norm's .tolist()) waited for the queued forward and backward,
    so that wait came off the step: perf/step_ms too low, tokens/s and MFU too high with train.diagnostics or
    train.spike_factor. The monitor now lets the queued work finish before its clock starts."""
    import time as clock
    from types import SimpleNamespace

    from gptlab.train import diagnostics

    queued = {"s": 0.0}  # seconds of the step's work the mocked GPU still has to run

    def synchronize(device=None):
        clock.sleep(queued["s"])
        queued["s"] = 0.0

    class Norms:
        def grad_norms(self):  # reads the sums back: waits for everything queued before it
            synchronize()
            return {"blocks.0": 1.0}

    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monitor = object.__new__(diagnostics.Monitor)  # only what grads_ready reads
    monitor.hardware, monitor.diag, monitor.spikes = SimpleNamespace(device="cuda:0"), Norms(), None
    monitor.due, monitor.spent, monitor.norms = True, 0.0, None
    queued["s"] = 0.3  # the forward and backward still running
    monitor.grads_ready()
    assert monitor.norms == {"blocks.0": 1.0} and monitor.take_spent() < 0.1
