"""The run directory at work: the tokenizer a run saves when it starts (`save_run_tokenizer`) and reading a run's
saved files back (`run_config`, `saved_tokenizer`); rebuilding a trained run from them is gptlab/config/trained.py's.
The tokenizer's sha256 is recorded in provenance.json when the run starts (`TOKENIZER_RECORD`), and every reader
checks the file against it: a tokenizer.json swapped in from another run, or edited with its own hash redone, is
refused in one line (gptlab/util/stored.py's pattern), as is a saved config that is not YAML.
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
from gptlab.util.stored import read_json, read_yaml

TOKENIZER_RECORD = "tokenizer_sha256"  # provenance.json's record of the tokenizer.json the run saved when it started
RESTORE = "restore it from a copy of the run"


def run_config(run_dir: Path):
    """The config a run was composed with (its .hydra/config.yaml); a file that is not a YAML mapping is one line."""
    saved = run_dir / ".hydra" / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no .hydra/config.yaml)")
    fix = f"{RESTORE} (rerunning the run's own command with hydra.run.dir={run_dir} writes it again)"
    return OmegaConf.create(read_yaml(saved, fix))


def save_run_tokenizer(run_dir: Path, tokenizer, data_fingerprint: str) -> str | None:
    """Save the tokenizer a run trains with as run_dir/tokenizer.json, when it starts (rank 0, before any step) ->
    its sha256 (provenance.json records it as TOKENIZER_RECORD), None for a tokenizer that is not saved.

    An existing valid file of this very tokenizer saved for the same data (a resume) is kept byte for byte; a
    tokenizer that is not char, byte, bpe or gpt2 (a synthetic task's, set by its config) is not saved.
    """
    doc = to_doc(tokenizer, data_fingerprint)
    if doc is None:
        return None
    path = run_dir / TOKENIZER_FILE
    try:
        kept = json.loads(path.read_text())
        from_doc(kept, str(path))
        if kept.get("data") == data_fingerprint and kept.get("sha256") == doc["sha256"]:
            return doc["sha256"]
    except (OSError, ValueError, ConfigError):
        pass  # absent, damaged or another run's: this run's own replaces it
    atomic_write_text(path, json.dumps(doc) + "\n")
    return doc["sha256"]


def _recorded_sha256(run_dir: Path) -> str | None:
    """The tokenizer sha256 provenance.json recorded when the run started (None: a run from before the record)."""
    path = run_dir / "provenance.json"
    record = read_json(path, RESTORE, missing={})
    sha = record.get(TOKENIZER_RECORD) if isinstance(record, dict) else None
    return sha if isinstance(sha, str) else None


def saved_tokenizer(run_dir: Path, trained_on: str | None):
    """The tokenizer run_dir/tokenizer.json holds, checked against the sha256 recorded when the run started and
    against the data the run's checkpoint trained on (`trained_on`), or None for a run saved before runs kept their
    tokenizer."""
    path = run_dir / TOKENIZER_FILE
    if not path.exists():
        return None
    doc = read_json(path, RESTORE)
    tok = from_doc(doc, str(path))
    recorded = _recorded_sha256(run_dir)
    if recorded is not None and doc.get("sha256") != recorded:
        raise ConfigError(
            f"{path}: sha256 {str(doc.get('sha256'))[:12]}, but the run recorded {recorded[:12]} when it started "
            f"(provenance.json {TOKENIZER_RECORD}): this is not the tokenizer the run trained with; restore the run's "
            "own tokenizer.json"
        )
    if trained_on is not None and doc.get("data") != trained_on:
        raise ConfigError(
            f"{path}: saved for data {str(doc.get('data'))[:24]}, but the run's newest checkpoint trained on "
            f"{trained_on[:24]}: this is another run's tokenizer; restore the run's own tokenizer.json"
        )
    return tok
