"""Progress of long data work (tokenizing, streaming a hub dataset, fitting BPE): a rich bar on a terminal, else a
log line every few seconds, with MB/s, tokens so far and an ETA when the total is known."""

from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger(__name__)


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def _eta(seconds: float) -> str:
    seconds = int(seconds)
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else f"{seconds // 60}:{seconds % 60:02d}"
    )


class DataProgress:
    """update(bytes, tokens) as work is done; close() prints the final line. `total_bytes` None = unknown."""

    def __init__(
        self, what: str, total_bytes: int | None, every_s: float = 5.0, done_bytes: int = 0, done_tokens: int = 0
    ):
        self.what, self.total, self.every_s = what, total_bytes, every_s
        self.bytes, self.tokens = done_bytes, done_tokens
        self._start_bytes = done_bytes
        self.t0 = self._last = time.monotonic()
        self._bar = None
        if sys.stderr.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[sizes]}"),
                TransferSpeedColumn(),
                TextColumn("{task.fields[tokens]} tokens"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(
                what, total=total_bytes, completed=done_bytes, sizes="", tokens=f"{done_tokens:,}"
            )

    def line(self) -> str:
        """The current state in one line (what the log gets)."""
        elapsed = max(time.monotonic() - self.t0, 1e-9)
        rate = (self.bytes - self._start_bytes) / elapsed
        of = f" of {_size(self.total)} ({100 * self.bytes / self.total:.0f} %)" if self.total else ""
        eta = (
            f", ETA {_eta((self.total - self.bytes) / rate)}"
            if self.total and rate > 0 and self.bytes < self.total
            else ""
        )
        return f"{self.what}: {_size(self.bytes)}{of}, {_size(rate)}/s, {self.tokens:,} tokens{eta}"

    def update(self, nbytes: int, ntokens: int) -> None:
        self.bytes += nbytes
        self.tokens += ntokens
        if self._bar is not None:
            self._bar.update(
                self._task,
                completed=self.bytes,
                tokens=f"{self.tokens:,}",
                sizes=_size(self.bytes) + (f" / {_size(self.total)}" if self.total else ""),
            )
        elif time.monotonic() - self._last >= self.every_s:
            self._last = time.monotonic()
            log.info("%s", self.line())

    def close(self) -> None:
        if self.total is not None:  # the total was an estimate (a .jsonl file's size counts its JSON too): now known
            self.total = self.bytes
        if self._bar is not None:
            self._bar.update(self._task, total=self.bytes, completed=self.bytes)
            self._bar.stop()
            self._bar = None
        log.info("%s (done in %.1f s)", self.line(), time.monotonic() - self.t0)
