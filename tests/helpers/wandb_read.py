"""Read offline W&B runs back the way the platform documents (`wandb leet inspect --json`), for tests."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
from pathlib import Path


def inspect_records(wandb_run_folder: Path) -> list[dict]:
    """All records of an offline W&B run, via the CLI the platform documents for reading runs back."""
    out = _leet(wandb_run_folder, "--json")
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def inspect_summary(wandb_run_folder: Path) -> dict:
    """The offline run's final summary (history rows folded in), via `wandb leet inspect --summary --json`."""
    return json.loads(_leet(wandb_run_folder, "--summary", "--json"))["summary"]


def _leet(wandb_run_folder: Path, *flags: str) -> str:
    """stdout of `wandb leet inspect FLAGS FOLDER`.

    An older wandb without `wandb leet` (the floor-version venv of `make test-floor`): the run file must exist and
    hold records; the read-back itself is skipped there (the main venv checks it)."""
    wandb_cli = Path(sys.executable).with_name("wandb")  # the CLI installed next to this interpreter
    if not _has_leet(str(wandb_cli)):
        import pytest

        deadline = time.monotonic() + 30  # its wandb-core may still be writing the file
        while not _written(wandb_run_folder) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _written(wandb_run_folder), f"no W&B run file in {wandb_run_folder}"
        pytest.skip("this wandb has no `wandb leet inspect` to read the run back (checked in the main venv)")
    return subprocess.run(
        [str(wandb_cli), "leet", "inspect", *flags, str(wandb_run_folder)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout


def of_type(records: list[dict], kind: str) -> list[dict]:
    """The payloads of the records of one type, in log order."""
    return [r[kind] for r in records if r.get("type") == kind]


def history(records: list[dict]) -> list[dict]:
    """The history rows (what W&B plots), in log order."""
    return [h["item"] for h in of_type(records, "history")]


def config(records: list[dict]) -> dict:
    """The run's config as W&B stored it (without W&B's own `_wandb` key)."""
    return {k: v for k, v in of_type(records, "run")[0]["config"]["update"].items() if k != "_wandb"}


@functools.cache
def _has_leet(wandb_cli: str) -> bool:
    """Whether this wandb's CLI has `leet` (newer releases; 0.19 has not)."""
    return subprocess.run([wandb_cli, "leet", "--help"], capture_output=True, timeout=60).returncode == 0


def _written(folder: Path) -> bool:
    files = list(Path(folder).glob("*.wandb"))
    return bool(files) and all(f.stat().st_size > 0 for f in files)
