"""One path from config to loop: a training run builds its hardware profile once and its model once on its device.

(The model is also built on the meta device, where it allocates nothing: once to check the component combination
before any data is touched, once by the memory check's cost model with the data's vocabulary.)
"""

from __future__ import annotations

import inspect

from gptlab.config import build
from gptlab.model.gpt import GPT
from gptlab.train import loop
from helpers.train import run_inprocess


def test_hardware_once_and_the_model_once_on_its_device(tmp_path, monkeypatch):
    made_hardware, made_models = [], []
    real_hardware, real_init = build.build_hardware, GPT.__init__

    def counting_hardware(cfg):
        made_hardware.append(1)
        return real_hardware(cfg)

    def counting_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        made_models.append(next(self.parameters()).device.type)

    monkeypatch.setattr(build, "build_hardware", counting_hardware)
    monkeypatch.setattr(GPT, "__init__", counting_init)
    summary = run_inprocess(tmp_path, steps=2, eval_interval=2)
    assert summary["status"] == "finished"
    assert len(made_hardware) == 1
    assert made_models.count("cpu") == 1
    assert made_models.count("meta") <= 2 and set(made_models) == {"cpu", "meta"}


def test_the_loop_takes_the_built_run_whole():
    """The loop gets the built run, its sinks and its start, a stop flag and, under a pruning search, the trial it
    reports to (a small protocol: train/loop.Trial): no config and no loose settings."""
    params = inspect.signature(loop.train).parameters
    assert list(params) == ["run", "sinks", "progress", "resumed", "stop", "trial"]
    assert params["trial"].annotation in ("Trial | None", loop.Trial | None)
    assert list(inspect.signature(loop.train_step).parameters) == ["run", "batches", "monitor"]


def test_one_training_loss_function():
    """Every backward pass in gptlab goes through train/loss.py's training_loss: a new loss term added there trains,
    replays (NaN anomaly) and profiles the same objective."""
    import re
    from pathlib import Path

    root = Path(loop.__file__).resolve().parents[1]
    callers = set()
    for path in root.rglob("*.py"):
        text = path.read_text()
        if ".backward()" in text:
            assert not re.search(r"_, loss = \w*model\(", text), f"{path} computes its own training loss"
            if "training_loss(" in text:
                callers.add(str(path.relative_to(root)))
    assert callers == {"train/loop.py", "train/anomaly.py", "train/profile/steps.py"}
