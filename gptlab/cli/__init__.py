"""Command-line entry points: the only code that touches Hydra's @main."""

from __future__ import annotations

import sys

from gptlab.errors import ConfigError


def fail(err: Exception, code: int = 2) -> None:
    """Print a user error as one line on stderr and exit non-zero (no traceback wall)."""
    print(f"error: {err}", file=sys.stderr)
    sys.exit(code)


__all__ = ["ConfigError", "fail"]
