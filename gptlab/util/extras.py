"""Optional dependencies: a feature that needs an extra (`pip install 'gptlab[NAME]'`) says so in one line."""

from __future__ import annotations

import importlib.util

from gptlab.errors import ConfigError


def missing(module: str) -> bool:
    """True when `module` cannot be imported here (checked without importing it)."""
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # a parent package missing, or a half-installed module
        return True


def require(module: str, extra: str, feature: str) -> None:
    """Refuse `feature` in one line when `module` (shipped by the gptlab[extra] extra) is not installed."""
    if missing(module):
        raise ConfigError(f"{feature} needs the {module!r} package, not installed here: pip install 'gptlab[{extra}]'")
