"""Older leftovers, each now one behaviour:

- one non-finite step was named twice, "anomaly at step N+1" and "step N: ... grad norm nan; skipped": every line
  about a step now numbers it as its metrics row would (1 = the first update);
- gptlab-flops accepted a negative (or zero) gpu_memory / link_bandwidth unless a sharded report read it;
- optimizer.fused=true on CPU died with torch's RuntimeError from the meta-device cost estimate;
- a run dir whose checkpoint belongs to another run printed torch's state_dict listing, one line per key.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from gptlab.config import build
from gptlab.config.costing import flops_report
from gptlab.config.trained import load_trained
from gptlab.errors import ConfigError
from helpers.train import FAST, rows, run_inprocess


def _poison_one_step(monkeypatch, call: int) -> None:
    """The `call`-th training forward and the next (an anomaly replay of that step) give NaN logits."""
    real, calls = build.build_model, []

    def poisoned(cfg, **kw):
        model = real(cfg, **kw)

        def hook(module, args, out):
            if module.training:
                calls.append(1)
                if call <= len(calls) <= call + 1:
                    return out * float("nan")

        model.norm_f.register_forward_hook(hook)
        return model

    monkeypatch.setattr(build, "build_model", poisoned)


def test_one_non_finite_step_is_named_once_with_its_rows_number(tmp_path, monkeypatch, caplog):
    _poison_one_step(monkeypatch, call=4)
    with caplog.at_level(logging.WARNING):
        run_inprocess(tmp_path / "r", "train.detect_anomaly=true", "train.nan_skip=1", steps=6, eval_interval=3)
    said = [r.getMessage() for r in caplog.records]
    anomaly = [int(m) for line in said for m in re.findall(r"^anomaly at step (\d+):", line)]
    skipped = [int(m) for line in said for m in re.findall(r"^step (\d+): loss .*; skipped \(1 of", line)]
    assert anomaly == skipped == [4]  # the 4th update: its row would have been step 4
    logged = [r["step"] for r in rows(tmp_path / "r") if "train/loss" in r]
    assert 4 not in logged and {3, 5} <= set(logged)
    assert (tmp_path / "r" / "diagnostics" / "anomaly_step_0000004.txt").is_file()


@settings(max_examples=30, deadline=None)
@given(
    key=st.sampled_from(["gpu_memory", "link_bandwidth"]),
    value=st.one_of(st.integers(-(10**12), 0), st.floats(-1e12, 0.0, allow_nan=False)),
    mode=st.sampled_from(["train", "prefill", "decode"]),
)
def test_flops_refuses_a_non_positive_device_figure_in_every_mode(key, value, mode):
    cfg = build.compose([f"{key}={value}", f"mode={mode}"], "flops")
    with pytest.raises(ConfigError, match=rf"^{key}=.*: expected a positive number or null$"):
        flops_report(cfg)


def test_flops_keeps_a_positive_device_figure():
    assert flops_report(build.compose(["gpu_memory=80e9", "link_bandwidth=4.5e11"], "flops")) is not None


def test_fused_adamw_on_cpu_trains(tmp_path):
    summary = run_inprocess(tmp_path / "r", "optimizer.fused=true", steps=2, eval_interval=2)
    assert summary["status"] == "finished"
    assert build.cost_report(build.compose(["optimizer.fused=true"]), 4, 64, vocab_size=65) is not None


def _trained(tmp: Path, name: str, *args: str) -> Path:
    run = tmp / name
    overrides = [*args, "schedule=constant", "schedule.warmup_steps=0"]
    run_inprocess(run, *overrides, steps=2, eval_interval=2)
    (run / ".hydra").mkdir(exist_ok=True)
    OmegaConf.save(build.compose([*FAST, "train.max_steps=2", "train.eval_interval=2", *overrides]),
                   run / ".hydra/config.yaml")  # fmt: skip
    return run


def test_a_checkpoint_of_another_run_is_one_line(tmp_path):
    mine, other = _trained(tmp_path, "mine"), _trained(tmp_path, "other", "model.d_model=32", "model.n_head=2")
    for ckpt in (mine / "checkpoints").glob("step_*.pt"):
        ckpt.unlink()
    for ckpt in (other / "checkpoints").glob("step_*.pt"):
        shutil.copy(ckpt, mine / "checkpoints" / ckpt.name)
    with pytest.raises(ConfigError) as err:
        load_trained(mine)
    message = str(err.value)
    assert "\n" not in message and "\t" not in message
    assert message.startswith(f"{mine}: its newest checkpoint does not fit the run's config (RuntimeError: ")


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "0"])
def test_a_claims_file_with_a_non_finite_or_zero_speedup_is_refused_in_one_line(tmp_path, value):
    from gptlab.compare.reading.claims import load_claims

    path = tmp_path / "claims.yaml"
    path.write_text(f"'attention=gqa':\n  speedup: {value}\n")
    with pytest.raises(ConfigError) as err:
        load_claims(str(path))
    assert "'attention=gqa'.speedup must be a finite number" in str(err.value) and "\n" not in str(err.value)


def test_empty_seeds_are_refused_not_taken_for_the_files_seeds():
    from gptlab.sweep.spec import resolve

    with pytest.raises(ConfigError, match="--seeds: '' is not a comma-separated list"):
        resolve("aa", [], seeds="", note=lambda _: None)
