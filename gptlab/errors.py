"""One exception type for user mistakes, printed as one line by the command-line entry points."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad config value, file or combination; the message is one line naming the key and what is allowed."""
