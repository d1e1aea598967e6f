"""Command-line entry points: the only code that touches Hydra's @main."""

from __future__ import annotations

import sys
from typing import NoReturn

from gptlab.errors import ConfigError
from gptlab.sinks.progress import console_log


def fail(err: Exception | str, code: int = 2) -> NoReturn:
    """Print a user error as one line on stderr (and in the run's train.log) and exit non-zero (no traceback)."""
    print(f"error: {err}", file=sys.stderr)
    console_log.error("error: %s", err)
    sys.exit(code)


__all__ = ["ConfigError", "fail"]
