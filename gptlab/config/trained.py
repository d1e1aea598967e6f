"""A trained run read back: its model with the newest checkpoint's weights and its text side, rebuilt from the config
the run saved (`load_trained`, `trained_text`).

It lives beside build because rebuilding is building; gptlab/state/rundir.py knows only where a run's files are.
"""

from __future__ import annotations

from pathlib import Path

from gptlab.config import build
from gptlab.errors import ConfigError
from gptlab.state import checkpoint, resume
from gptlab.state.rundir import run_config, saved_tokenizer


def _data_as_trained(run_dir: Path, cfg, trained_on: str | None, what: str = "its tokenizer", hint: str = ""):
    """The run's data rebuilt from its config; refused when it is not the data the run trained on (`what` would
    differ)."""
    data = build.build_data(cfg, int(cfg.model.block_size))
    if trained_on is not None and trained_on != data.fingerprint:  # an edited corpus refits the tokenizer
        raise ConfigError(
            f"{run_dir}: its data ({cfg.data.get('paths') or data.name}) changed since training (fingerprint "
            f"{data.fingerprint[:12]} != {trained_on[:12]}), so {what} would differ; restore the corpus it "
            f"trained on{hint}"
        )
    return data


class TrainedText:
    """A trained run's text side: the tokenizer it trained with and, on demand, its default prompt."""

    def __init__(self, run_dir: Path, cfg, tokenizer, trained_on: str | None, data=None):
        self.run_dir, self.cfg, self.trained_on, self._data = run_dir, cfg, trained_on, data
        self.tokenizer = tokenizer
        self.vocab_size = int(tokenizer.vocab_size)

    def sample_prompt(self) -> str:
        """The first line of the run's val split (read from its corpus, which must be unchanged), else a newline."""
        if self._data is None:
            self._data = _data_as_trained(
                self.run_dir, self.cfg, self.trained_on, "the default prompt (its val text)", " or pass --prompt TEXT"
            )
        prompt = getattr(self._data, "sample_prompt", None)
        return prompt() if prompt is not None else "\n"


def trained_text(run_dir: Path, cfg, state: dict) -> TrainedText:
    """The text side of the run a checkpoint `state` of run_dir belongs to: its saved tokenizer, or for a run saved
    before runs kept theirs, the data rebuilt from its config (refused when the corpus changed since training)."""
    trained_on = (state.get("identity") or {}).get("data")
    tok = saved_tokenizer(run_dir, trained_on)
    if tok is not None:
        return TrainedText(run_dir, cfg, tok, trained_on)
    data = _data_as_trained(run_dir, cfg, trained_on)
    return TrainedText(run_dir, cfg, data.tokenizer, trained_on, data=data)


def load_trained(run_dir: Path):
    """(model with the newest checkpoint's weights, TrainedText, step) rebuilt from the run's saved config.

    The tokenizer is the one the run saved when it started (tokenizer.json); a run saved before runs kept theirs
    rebuilds its data from the config, refused when the corpus changed since training. A sharded (hardware=fsdp)
    checkpoint is read into this one process (DCP gathers every rank's shards).
    """
    cfg, state = run_config(run_dir), checkpoint.load_latest(run_dir, resume=False)
    if state is None:
        raise ConfigError(f"{run_dir}: no readable checkpoint in {checkpoint.ckpt_dir(run_dir)}")
    text = trained_text(run_dir, cfg, state)
    model = build.build_model(cfg, vocab_size=text.vocab_size)
    try:
        resume.load_weights(model, None, state)
    except (KeyError, RuntimeError) as err:
        raise ConfigError(
            f"{run_dir}: its newest checkpoint does not fit the run's config ({resume.misfit(err)})"
        ) from None
    return model.eval(), text, int(state["step"])
