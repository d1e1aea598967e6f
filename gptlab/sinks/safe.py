"""Isolation for sinks: a failing sink warns once and goes quiet; training and the other sinks go on."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("gptlab.sinks")


def error_summary(error: BaseException) -> str:
    """`TypeName: message` squeezed onto one line and cut to a readable length."""
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= 300 else text[:297] + "..."


class SafeSink:
    """Wraps any sink: the first exception in log/summary/close logs ONE warning and disables the sink.

    The warning goes to the `gptlab.sinks` logger (Hydra's job log and stderr), not to `warnings`,
    so `-W error` can never turn a logging hiccup into a crashed run.
    """

    def __init__(self, inner: Any, name: str) -> None:
        self.inner = inner
        self.name = name
        self.error: str | None = None  # the one-line error that disabled the sink, if any

    @property
    def disabled(self) -> bool:
        """True once the wrapped sink has failed."""
        return self.error is not None

    def _call(self, method: str, *args: Any) -> None:
        """Run inner.<method>(*args) unless disabled; on failure warn once and disable."""
        if self.disabled:
            return
        try:
            getattr(self.inner, method)(*args)
        except Exception as exc:  # any sink bug or I/O failure; KeyboardInterrupt still propagates
            self.error = error_summary(exc)
            log.warning("logging sink %r disabled after %s() failed: %s", self.name, method, self.error)

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Forward one row."""
        self._call("log", metrics, step)

    def summary(self, values: dict) -> None:
        """Forward end-of-run values."""
        self._call("summary", values)

    def truncate_after(self, step: int) -> None:
        """Forward a resume's truncation (to sinks that keep rows); a failure here disables the sink like any other."""
        if hasattr(self.inner, "truncate_after"):
            self._call("truncate_after", step)

    def close(self, status: str = "finished") -> None:
        """Forward the close."""
        self._call("close", status)

    def __getattr__(self, attr: str) -> Any:
        # Expose the inner sink's extras (e.g. WandbSink.run_dir_path) without wrapping each one.
        if attr.startswith("_") or attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def __repr__(self) -> str:
        state = f"disabled: {self.error}" if self.disabled else "ok"
        return f"SafeSink({self.name!r}, {state})"
