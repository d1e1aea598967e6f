"""profile=true leaves the run as it was: state snapshot kept on the CPU, RNG restored (issue 12, item 8)."""

from __future__ import annotations

import pytest
import torch

from gptlab.train.profile import state as profile_state
from helpers.model import tiny_model
from helpers.train import rows, run_inprocess


def test_profile_does_not_change_the_curve_with_dropout(tmp_path):
    """With dropout 0.1 (RNG-dependent), a profiled run's losses equal an unprofiled run's exactly."""
    dropout = ["model.dropout=0.1", "attention.dropout=0.1"]
    plain = run_inprocess(tmp_path / "plain", *dropout, steps=4, eval_interval=2)
    profiled = run_inprocess(tmp_path / "profiled", *dropout, "profile=true", steps=4, eval_interval=2)
    assert (tmp_path / "profiled" / "profile.json").is_file()
    losses = [
        [(r["step"], r.get("train/loss"), r.get("val/loss")) for r in rows(tmp_path / d)] for d in ("plain", "profiled")
    ]
    assert losses[0] == losses[1] and len(losses[0]) >= 4
    assert profiled["final_val_loss"] == plain["final_val_loss"]


def test_snapshot_is_a_cpu_copy_and_restores_everything():
    model = tiny_model("position=rope").train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    idx = torch.randint(0, 61, (2, 17))
    model(idx[:, :-1], idx[:, 1:])[1].backward()
    optimizer.step()
    saved = profile_state.snapshot_state(model, optimizer)
    tensors = list(saved["model"].values()) + [t for s in saved["optimizer"]["state"].values() for t in s.values()]
    assert all(t.device.type == "cpu" for t in tensors) and len(tensors) > len(saved["model"])
    live = {t.untyped_storage().data_ptr() for t in model.state_dict().values()}
    assert not live & {t.untyped_storage().data_ptr() for t in saved["model"].values()}  # copies, not views
    expected = torch.rand(3)  # the next draws after the snapshot
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    optimizer.step()
    torch.rand(5)
    profile_state.restore_state(model, optimizer, saved)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved["model"].items())
    assert torch.equal(torch.rand(3), expected)


def test_cuda_rng_is_saved_and_restored(monkeypatch):
    """torch.cuda mocked (available, initialised, RNG getters/setters): the CUDA RNG travels with the snapshot."""
    state = [torch.tensor([1, 2, 3], dtype=torch.uint8)]
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: state)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    saved = profile_state.snapshot_state(model, optimizer)
    assert saved["cuda_rng"] is state
    profile_state.restore_state(model, optimizer, saved)
    assert restored == [state]


def _leaves(value) -> list:
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


@pytest.mark.parametrize("value", [{"a": [torch.ones(2), (torch.zeros(1), 3)]}, torch.arange(3)])
def test_to_cpu_copies_nested_tensors(value):
    out = profile_state.to_cpu(value)
    pairs = list(zip(_leaves(value), _leaves(out)))
    assert len(pairs) == len(_leaves(value)) and type(out) is type(value)
    for a, b in pairs:
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b) and a.data_ptr() != b.data_ptr() and b.device.type == "cpu"
        else:
            assert a == b
