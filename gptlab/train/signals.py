"""Stopping a run cleanly on a signal: finish the step, checkpoint, then hand the signal on."""

from __future__ import annotations

import signal


class StopFlag:
    """Set by SIGTERM, SIGUSR1 or SIGUSR2 (what SLURM and submitit send before a time limit or pre-emption), or Ctrl-C.

    The loop finishes its step, checkpoints and stops; `forward()` then hands the signal to the handler
    installed before (submitit's requeue on SIGUSR2), so nothing is lost mid-step. A second Ctrl-C stops at once.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)

    def __init__(self):
        self.signum, self.previous = None, {}
        for sig in self.SIGNALS:
            try:
                self.previous[sig] = signal.signal(sig, self._set)
            except ValueError:  # not the main thread (e.g. some launchers)
                pass

    def _set(self, signum, frame):
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt  # impatient: the second Ctrl-C does not wait for the step
        self.signum = signum

    @property
    def status(self) -> str:
        """The run status a stop by this signal leaves: "interrupted" for Ctrl-C, else "preempted"."""
        return "interrupted" if self.signum == signal.SIGINT else "preempted"

    def restore(self) -> None:
        """Put the earlier handlers back (the loop is over)."""
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def forward(self) -> None:
        """restore(), then call the earlier handler of the signal received, if it was a Python function."""
        self.restore()
        handler = self.previous.get(self.signum)
        if callable(handler):
            handler(self.signum, None)
