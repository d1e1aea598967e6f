"""The run directory at work: the tokenizer a run saves when it starts (`save_run_tokenizer`) and reading a run's
saved files back (`run_config`, `saved_tokenizer`); rebuilding a trained run from them is gptlab/config/trained.py's.
What a run dir holds, and the guards every writer asks, are gptlab/state/layout.py's; one live run per dir (the
lock) is gptlab/state/lock.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from gptlab.data.tokenizer_file import from_doc, to_doc
from gptlab.errors import ConfigError
from gptlab.state.layout import TOKENIZER_FILE
from gptlab.util.io import atomic_write_text


def run_config(run_dir: Path):
    """The config a run was composed with (its .hydra/config.yaml)."""
    saved = run_dir / ".hydra" / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no .hydra/config.yaml)")
    return OmegaConf.load(saved)


def save_run_tokenizer(run_dir: Path, tokenizer, data_fingerprint: str) -> None:
    """Save the tokenizer a run trains with as run_dir/tokenizer.json, when it starts (rank 0, before any step).

    An existing valid file saved for the same data (a resume) is kept byte for byte; a tokenizer that is not char,
    byte, bpe or gpt2 (a synthetic task's, set by its config) is not saved.
    """
    doc = to_doc(tokenizer, data_fingerprint)
    if doc is None:
        return
    path = run_dir / TOKENIZER_FILE
    try:
        kept = json.loads(path.read_text())
        from_doc(kept, str(path))
        if kept.get("data") == data_fingerprint:
            return
    except (OSError, ValueError, ConfigError):
        pass  # absent, damaged or another run's: this run's own replaces it
    atomic_write_text(path, json.dumps(doc) + "\n")


def saved_tokenizer(run_dir: Path, trained_on: str | None):
    """The tokenizer run_dir/tokenizer.json holds, or None for a run saved before runs kept their tokenizer."""
    path = run_dir / TOKENIZER_FILE
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: unreadable ({err}); restore it from a copy of the run") from None
    tok = from_doc(doc, str(path))
    if trained_on is not None and doc.get("data") != trained_on:
        raise ConfigError(
            f"{path}: saved for data {str(doc.get('data'))[:24]}, but the run's newest checkpoint trained on "
            f"{trained_on[:24]}: this is another run's tokenizer; restore the run's own tokenizer.json"
        )
    return tok
