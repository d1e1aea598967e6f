"""gptlab's Hugging Face commands print gptlab's own lines only: gptlab-export --format hf, gptlab-eval and gptlab-train
with train.init_from=hf:, run as real processes in a folder outside any git repository, show no third-party progress
bar (transformers, huggingface_hub, datasets, lm-eval's tqdm) and no `fatal:` line from a git call."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess

import pytest

pytest.importorskip("lm_eval", reason="gptlab[eval] not installed: make setup installs it")

from test_eval import _task, _train  # noqa: E402
from test_interop_hf import GPT2_RUN, _hf_folder  # noqa: E402

from helpers.cli import run_cli  # noqa: E402
from helpers.train import FAST, train_env  # noqa: E402

# a tqdm bar: "40%|████      | 2/5 [00:00<00:00, 3.1it/s]", "Generating test split: 16 examples [00:00, 2250.39 examples/s]"
BAR = re.compile(r"\d+%\||[▏▎▍▌▋▊▉█]|(it|s)/(s|it)\]|examples/s\]")


def test_the_bar_pattern_finds_a_real_tqdm_bar():
    from tqdm import tqdm

    out = io.StringIO()
    for _ in tqdm(range(3), file=out, disable=False, mininterval=0):
        pass
    assert BAR.search(out.getvalue()) and "it/s]" in out.getvalue()
    assert not BAR.search("step 2/2 | loss 5.364 | val 5.142 | 4,673 tok/s | eta 0s")  # gptlab's own progress line


def test_progress_bars_are_off_inside_and_as_they_were_after():
    import datasets
    from huggingface_hub import utils as hub
    from transformers.utils import logging as transformers_logging

    from gptlab.interop.quiet import no_progress_bars

    def states():
        on = transformers_logging.is_progress_bar_enabled(), not hub.are_progress_bars_disabled()
        return (*on, datasets.is_progress_bar_enabled())

    def set_states(transformers_on: bool, hub_on: bool, datasets_on: bool) -> None:
        (transformers_logging.enable_progress_bar if transformers_on else transformers_logging.disable_progress_bar)()
        (hub.enable_progress_bars if hub_on else hub.disable_progress_bars)()
        (datasets.enable_progress_bars if datasets_on else datasets.disable_progress_bars)()

    before = states()  # process-wide switches: an earlier test in this worker (data=hf) may have turned one off
    set_states(True, True, True)
    try:
        with no_progress_bars(datasets=True):
            assert states() == (False, False, False)
        assert states() == (True, True, True)
        hub.disable_progress_bars()  # a caller's own choice stays: huggingface_hub's off, transformers' on
        with no_progress_bars():
            assert states() == (False, False, True)
        assert states() == (True, False, True)
    finally:
        set_states(*before)


@pytest.mark.slow  # trains, then runs three CLIs (lm-eval, HF loads): ~45 s on 2 busy cores
def test_hf_clis_print_no_progress_bars_and_no_git_errors(tmp_path):
    if shutil.which("git"):  # the folder is outside any git repository: `git describe` there fails with "fatal:"
        done = subprocess.run(["git", "describe", "--always"], cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode != 0 and done.stderr.startswith("fatal:")
    run = tmp_path / "run"
    _train(run)
    tasks = _task(tmp_path / "tasks")
    _hf_folder(tmp_path / "hf-in")
    env = train_env(HF_HOME=str(tmp_path / "hf-home"))
    commands = {
        "gptlab-export": ["gptlab.cli.export", str(run), "--format", "hf", "--out", str(tmp_path / "hf-out")],
        "gptlab-eval": ["gptlab.cli.eval", str(run), "--tasks", "tiny_mc", "--include-path", str(tasks)],
        "gptlab-train": [
            "gptlab.cli.train",
            *FAST,
            *GPT2_RUN,
            "data.tokenizer=byte",
            "train.max_steps=1",
            "train.eval_interval=1",
            f"train.init_from=hf:{tmp_path / 'hf-in'}",
            f"hydra.run.dir={tmp_path / 'run2'}",
        ],
    }
    for name, args in commands.items():
        done = run_cli(*args, cwd=tmp_path, env=env)
        assert done.returncode == 0, f"{name}: {done.stderr[-2000:]}"
        for stream, text in (("stdout", done.stdout), ("stderr", done.stderr)):
            assert not BAR.search(text), f"{name} {stream} holds a progress bar:\n{text}"
            assert not re.search(r"(?m)^fatal:", text), f"{name} {stream} holds a git error:\n{text}"
    # each did its work
    assert (tmp_path / "hf-out" / "model.safetensors").is_file()
    assert "acc" in json.loads((run / "eval.json").read_text())["tasks"]["tiny_mc"]["metrics"]
    summary = json.loads((tmp_path / "run2" / "summary.json").read_text())
    assert summary["init_from"]["checkpoint"] == f"hf:{tmp_path / 'hf-in'}"
