"""Read offline W&B runs back the way the platform documents (`wandb leet inspect --json`), for tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def inspect_records(wandb_run_folder: Path) -> list[dict]:
    """All records of an offline W&B run, via the CLI the platform documents for reading runs back."""
    wandb_cli = Path(sys.executable).with_name("wandb")  # the CLI installed next to this interpreter
    out = subprocess.run(
        [str(wandb_cli), "leet", "inspect", "--json", str(wandb_run_folder)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def of_type(records: list[dict], kind: str) -> list[dict]:
    """The payloads of the records of one type, in log order."""
    return [r[kind] for r in records if r.get("type") == kind]


def history(records: list[dict]) -> list[dict]:
    """The history rows (what W&B plots), in log order."""
    return [h["item"] for h in of_type(records, "history")]


def config(records: list[dict]) -> dict:
    """The run's config as W&B stored it (without W&B's own `_wandb` key)."""
    return {k: v for k, v in of_type(records, "run")[0]["config"]["update"].items() if k != "_wandb"}
