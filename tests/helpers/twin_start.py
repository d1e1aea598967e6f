"""A gptlab-train started at a set moment, for the twin-start tests: `python -m helpers.twin_start GO DELAY ARGS...`
imports the CLI, waits until the file GO exists, sleeps DELAY seconds, then runs `gptlab-train ARGS` as the console
script would (its exit code and stderr are the CLI's own)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from gptlab.cli.train import main as train


def main() -> None:
    go, delay, *args = sys.argv[1:]
    while not Path(go).exists():  # the barrier: every twin is imported and waiting before any starts
        time.sleep(0.0005)
    time.sleep(float(delay))
    sys.argv = ["gptlab-train", *args]
    train()


if __name__ == "__main__":
    main()
