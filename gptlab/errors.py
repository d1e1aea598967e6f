"""The exceptions gptlab's command-line entry points print as one line: a user's mistake, or a run that failed."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad config value, file or combination; the message is one line naming the key and what is allowed."""


class TrainingDiverged(RuntimeError):
    """The loss became NaN/inf more often than train.nan_skip allows."""
