"""Command-line entry points: the only code that touches Hydra's @main."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import NoReturn

from gptlab.errors import ConfigError
from gptlab.sinks.progress import console_log


def fail(err: Exception | str, code: int = 2) -> NoReturn:
    """Print a user error as one line on stderr (and in the run's train.log) and exit non-zero (no traceback)."""
    print(f"error: {err}", file=sys.stderr)
    console_log.error("error: %s", err)
    sys.exit(code)


__all__ = ["ConfigError", "fail"]


@contextlib.contextmanager
def hydra_raises() -> Iterator[None]:
    """HYDRA_FULL_ERROR=1 inside (Hydra raises instead of printing a multi-line report, so the CLI can print one
    line); the variable is put back as it was afterwards."""
    previous = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = previous
