"""Metric sinks: where the training loop sends its numbers (local files, W&B, a progress display).

The loop receives a list of built sinks and never imports W&B or Hydra. Every sink follows `Sink`:

- `log(metrics, step)` writes one row: the metrics measured at optimizer step `step`;
- `summary(values)` merges end-of-run values into the run summary (later calls update earlier keys);
- `close(status)` flushes and finishes; status is "finished", "failed", "preempted", "interrupted", "pruned" (a
  tune pruner stopped it) or "running".

`SafeSink` wraps any sink so a failing sink warns once and goes quiet instead of stopping training.
`WandbSink` lives in `gptlab.sinks.wandb` and is imported only when W&B logging is configured.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Sink(Protocol):
    """Receives metric rows, end-of-run values and the final status of one training run."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Record one row: the metrics measured at optimizer step `step`."""

    def summary(self, values: dict) -> None:
        """Merge end-of-run values (final/best loss, medians, choices, ...) into the run summary."""

    def close(self, status: str = "finished") -> None:
        """Flush and finish; safe to call more than once."""


class NullSink:
    """A sink that drops everything: `logger=none` builds this, so build code needs no null special case."""

    def __init__(self, **_ignored: Any) -> None:
        # Accepts (and ignores) the run-time arguments build.py passes to every logger partial.
        pass

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Drop the row."""

    def summary(self, values: dict) -> None:
        """Drop the values."""

    def close(self, status: str = "finished") -> None:
        """Nothing to flush."""
