"""gptlab-sweep checks its arms before running: no-op choices and arms that build the identical model, one line each."""

from __future__ import annotations

import pytest
import yaml

from gptlab.cli.sweep import main, one_experiment
from gptlab.sweep.identity import identity_warnings
from gptlab.sweep.spec import load_sweep
from gptlab.util.paths import SWEEPS_DIR


def _sweep_file(tmp_path, arms: dict) -> str:
    path = tmp_path / "mini.yaml"
    path.write_text(yaml.safe_dump({"seeds": [0, 1], "overrides": ["model=tiny"], "arms": arms}, sort_keys=False))
    return str(path)


def test_dry_run_flags_identical_arms_and_no_ops_once_each(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    arms = {
        "mha": ["attention=mha"],
        "gqa": ["attention=gqa"],
        "gqa2": ["attention=gqa", "attention.n_kv_head=2"],
        "lr": ["optimizer.lr=0.01"],
        "wide": ["attention=sliding", "attention.window=512"],
    }
    assert main([_sweep_file(tmp_path, arms), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    warnings = [line for line in out if line.startswith("[mini] warning:")]
    fingerprint = next(line for line in warnings if "build the identical model" in line).split("fingerprint ")[1][:16]
    assert warnings == [
        "[mini] warning: arm 'gqa': attention=gqa with attention.n_kv_head=4 == model.n_head=4 is MHA",
        f"[mini] warning: arms 'mha' and 'gqa' build the identical model (fingerprint {fingerprint}): "
        "the same experiment twice, every difference is noise",
        "[mini] warning: arm 'wide': attention=sliding with attention.window=512 >= model.block_size=128 "
        "is full attention",
    ]
    # 'lr' builds the mha model too, but trains it differently: a real experiment, not flagged.
    assert sum(": gptlab-train " in line for line in out) == 10  # 5 arms x 2 seeds, each run printed once
    assert not (tmp_path / "outputs").exists()  # a dry run writes nothing


def test_an_arm_that_does_not_build_fails_the_dry_run_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    arms = {"mha": ["attention=mha"], "odd": ["attention=gqa", "attention.n_kv_head=3"]}
    assert main([_sweep_file(tmp_path, arms), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "[mini] arm 'odd' does not build: attention.n_kv_head=3 must be >= 1 and divide model.n_head=4"
    )


def test_one_swiglu_width_asked_two_ways_is_one_model(tmp_path, capsys, monkeypatch):
    """d_model 128: ratio 3 matched to the GELU MLP's params gives hidden 256, as ratio 2 unmatched does; the model
    is the same, so the fingerprint is (what match_params kept is words, not the model)."""
    monkeypatch.chdir(tmp_path)
    arms = {
        "matched": ["mlp=swiglu", "mlp.ratio=3"],
        "plain": ["mlp=swiglu", "mlp.ratio=2", "mlp.match_params=false"],
    }
    assert main([_sweep_file(tmp_path, arms), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "arms 'matched' and 'plain' build the identical model" in out


@pytest.mark.parametrize("name", sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml")))
def test_shipped_sweeps_have_no_identical_arms(name):
    _, spec, _ = load_sweep(name)
    assert identity_warnings(name, spec, [], 0, one_experiment) == ([], [])
