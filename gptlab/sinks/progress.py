"""Human progress: a rich progress bar on a terminal, plain periodic lines elsewhere (SLURM logs).

The plain lines also go to the `gptlab.console` logger, which Hydra's job logging (conf/hydra/job_logging/
gptlab.yaml) writes to the run's train.log only: the console already shows them.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from gptlab.runtime.placement import launch_rank

CONSOLE_LOG = "gptlab.console"  # lines shown on the console, copied to train.log (never to the console again)
console_log = logging.getLogger(CONSOLE_LOG)
console_log.addHandler(logging.NullHandler())  # silent where no job logging routes it to a file


def _first_rank_or_warning(record: logging.LogRecord) -> bool:
    """A job's ranks share one train.log: only rank 0 copies its console lines (progress, the end-of-run report)
    there; another rank's warnings and errors still land."""
    return record.levelno >= logging.WARNING or launch_rank() == 0


console_log.addFilter(_first_rank_or_warning)
console_log.propagate = False
console_log.setLevel(logging.INFO)  # Hydra's job logging sets the same; the level of a bare test process is WARNING


def format_duration(seconds: float) -> str:
    """Compact duration: 45s, 1m12s, 2h03m."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _is_tty(stream: TextIO) -> bool:
    """True when `stream` is an interactive terminal."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False  # no isatty, or a closed stream


class ProgressSink:
    """Shows step, loss, val loss, tokens/s and ETA; never writes files.

    Plain mode prints a line on the first row, on every eval row (one with `val/loss`), at the last
    step and otherwise at most once every `interval_s` seconds; a train row at a step that is evaluated
    next (the last step, or a multiple of `eval_interval`) waits for that eval row, so each eval step is one
    line. `tty=None` detects the terminal.
    """

    def __init__(
        self,
        total_steps: int,
        stream: TextIO | None = None,
        interval_s: float = 10.0,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        eval_interval: int | None = None,
    ) -> None:
        self.total_steps = int(total_steps)
        self.eval_interval = eval_interval
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = float(interval_s)
        self.tty = _is_tty(self.stream) if tty is None else bool(tty)
        self._clock = clock
        self._latest: dict[str, float] = {}  # last value of each metric; val/loss persists between evals
        self._step = 0
        self._first: tuple[int, float] | None = None  # (step, time) of the first row, for the ETA
        self._last_print: float | None = None
        self._printed_step: int | None = None
        self._completed: int | None = None  # the steps the run completed, from its summary
        self._bar: Any = None  # rich Progress, created on the first row in tty mode
        self._task = None
        self._closed = False

    def eta_s(self) -> float | None:
        """Seconds left at the wall-clock rate seen so far (evals included), or None before two rows."""
        if self._first is None:
            return None
        first_step, first_t = self._first
        done, elapsed = self._step - first_step, self._clock() - first_t
        if done <= 0 or elapsed <= 0:
            step_ms = self._latest.get("perf/step_ms")
            return None if not step_ms else (self.total_steps - self._step) * step_ms / 1000.0
        return (self.total_steps - self._step) * elapsed / done

    def line(self) -> str:
        """The plain status line: `step 100/1000 | loss 2.31 | val 2.40 | 4,100 tok/s | eta 1m12s`."""
        parts = [f"step {self._step}/{self.total_steps}"]
        for key, label in (("train/loss", "loss"), ("val/loss", "val"), ("val/acc", "acc")):
            if self._latest.get(key) is not None:
                parts.append(f"{label} {self._latest[key]:.4g}")
        if self._latest.get("perf/tokens_per_s") is not None:
            parts.append(f"{self._latest['perf/tokens_per_s']:,.0f} tok/s")
        eta = self.eta_s()
        if eta is not None:
            parts.append(f"eta {format_duration(eta)}")
        return " | ".join(parts)

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Update the display with one row."""
        now = self._clock()
        self._step = int(step)
        if self._first is None:
            self._first = (self._step, now)
        for key, value in metrics.items():
            try:
                self._latest[key] = float(value)
            except (TypeError, ValueError):
                continue  # non-numeric extras are not shown
        is_eval = "val/loss" in metrics
        due = self._last_print is None or now - self._last_print >= self.interval_s
        if self.tty:
            self._update_bar(is_eval)
        if is_eval or (due and not self._eval_follows()):
            self._print(now)

    def _eval_follows(self) -> bool:
        """True when an eval row at this step comes next (the loop evaluates after the train row)."""
        every = self.eval_interval
        return self._step >= self.total_steps or bool(every and every > 0 and self._step % every == 0)

    def _print(self, now: float) -> None:
        """Write the status line (plain mode; the bar shows it in tty mode) and copy it to the run's log."""
        line = self.line()
        if not self.tty:
            print(line, file=self.stream, flush=True)
        console_log.info(line)
        self._last_print, self._printed_step = now, self._step

    def _update_bar(self, is_eval: bool) -> None:
        """Advance the rich bar; eval rows also leave a permanent line above it."""
        if self._bar is None:
            self._start_bar()
        fields = {"loss": self._fmt("train/loss"), "val": self._fmt("val/loss"), "tps": self._fmt_tps()}
        self._bar.update(self._task, completed=self._step, **fields)
        if is_eval:
            self._bar.console.print(self.line(), highlight=False)  # stays above the bar

    def _start_bar(self) -> None:
        """Create and start the rich progress bar (imported here: plain mode never needs rich)."""
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        console = Console(file=self.stream)
        self._bar = Progress(
            TextColumn("step {task.completed}/{task.total}"),
            BarColumn(),
            TextColumn("loss {task.fields[loss]} | val {task.fields[val]} | {task.fields[tps]} tok/s"),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
        )
        self._bar.start()
        self._task = self._bar.add_task(
            "train", total=self.total_steps, completed=self._step, loss="-", val="-", tps="-"
        )

    def _fmt(self, key: str) -> str:
        """A metric for the bar, or '-' when not measured yet."""
        value = self._latest.get(key)
        return "-" if value is None else f"{value:.4g}"

    def _fmt_tps(self) -> str:
        """tokens/s with thousands separators, or '-'."""
        value = self._latest.get("perf/tokens_per_s")
        return "-" if value is None else f"{value:,.0f}"

    def summary(self, values: dict) -> None:
        """The end-of-run table is the entry point's job; the steps the run completed are what close() reports (the
        last logged step can be up to train.log_interval - 1 steps behind a preempted run's checkpoint)."""
        if isinstance(values.get("steps"), int):
            self._completed = values["steps"]

    def close(self, status: str = "finished") -> None:
        """Stop the bar (or print the last line if it was not printed) and report the final status."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if self._first is not None and self._printed_step != self._step:
            self._print(self._clock())
        if status != "finished" and self._first is not None:
            step = self._step if self._completed is None else self._completed
            print(f"stopped at step {step}/{self.total_steps}: {status}", file=self.stream, flush=True)
            console_log.info("stopped at step %d/%d: %s", step, self.total_steps, status)
