"""CSV sink: one spreadsheet-ready table of every logged row, `step` first, a column per metric key."""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
from pathlib import Path
from typing import IO, Any

from gptlab.util.io import append_whole, atomic_write_text


def cell(value: Any) -> str:
    """One CSV cell: plain numbers (repr round-trips floats), nan/inf/-inf as words, '' for None."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()  # 0-d torch tensor or numpy scalar
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    return str(value)


def _lines(columns: list[str], rows: list[dict[str, str]], header: bool = True) -> str:
    """The CSV text of rows under `columns` (missing keys are empty cells), header first unless told not."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, restval="", lineterminator="\n")
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def read_table(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """The header and complete rows of a CSV written by CsvSink; a torn last line is skipped."""
    if not path.exists():
        return [], []
    text = path.read_text(encoding="utf-8")
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]  # killed mid-append: drop the partial row
    reader = csv.DictReader(io.StringIO(text))
    columns = list(reader.fieldnames or [])
    rows = []
    for row in reader:
        with contextlib.suppress(TypeError, ValueError):
            int(row.get("step") or "")
            rows.append({k: v for k, v in row.items() if k is not None and v})
    return columns, rows


class CsvSink:
    """Writes run_dir/<filename>: a header, then one row per step (a second log() at the same step, e.g. the eval
    after the train metrics, fills that step's row in: the file is rewritten atomically, once per eval).

    The header is `step` then the metric keys in the order they first appeared. A row with a new key
    rewrites the file atomically with the widened header (earlier rows get empty cells); otherwise
    the row is appended and flushed. Missing values are empty cells; NaN and infinities are written
    as nan, inf and -inf (what spreadsheet and pandas readers parse as floats), so "not measured"
    and "not finite" stay distinguishable. resumed=False starts the file afresh; resumed=True keeps
    it, and the loop then calls `truncate_after(step)`. summary() is a no-op (summary.json has it).
    """

    def __init__(
        self, run_dir: str | os.PathLike, filename: str = "metrics.csv", resumed: bool = False, **_ignored: Any
    ) -> None:
        # _ignored: build code passes config, name, group, tags, ... to every logger partial.
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / filename
        self.columns: list[str] = ["step"]
        self._file: IO[str] | None = None
        self._closed = False
        self._last: dict[str, str] | None = None  # the newest row written, which a log() at its step completes
        for stale in self.run_dir.glob(f".{filename}.*.tmp"):  # left by a process killed mid-rewrite
            stale.unlink(missing_ok=True)
        rows: list[dict[str, str]] = []
        if resumed:
            header, rows = read_table(self.path)
            self.columns = ["step"] + [c for c in header if c != "step"]
            self._last = rows[-1] if rows else None
        self._rewrite(rows)  # fresh: header only; resumed: drops a torn last line

    def _rewrite(self, rows: list[dict[str, str]]) -> None:
        """Atomically replace the file with the current header and `rows`, then reopen it for appends."""
        if self._file is not None:
            self._file.close()
            self._file = None
        atomic_write_text(self.path, _lines(self.columns, rows))
        self._file = open(self.path, "a", encoding="utf-8", newline="")

    def truncate_after(self, step: int) -> int:
        """Drop rows with step > `step` (and columns only they used); returns the rows kept."""
        _, rows = read_table(self.path)
        kept = [row for row in rows if int(row["step"]) <= step]
        used = {key for row in kept for key in row}
        self.columns = ["step"] + [c for c in self.columns if c != "step" and c in used]
        self._last = kept[-1] if kept else None
        self._rewrite(kept)
        return len(kept)

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Append one row; a row with new keys rewrites the file with the wider header first."""
        if self._file is None:
            raise RuntimeError(f"CsvSink for {self.path} is closed")
        row = {"step": str(int(step)), **{k: cell(v) for k, v in metrics.items() if k != "step"}}
        same_step = self._last is not None and self._last["step"] == row["step"]
        if same_step:
            row = {**self._last, **row}  # type: ignore[dict-item]
        new = [key for key in row if key not in self.columns]
        self.columns += new
        self._last = row
        if new or same_step:
            _, rows = read_table(self.path)
            self._rewrite((rows[:-1] if same_step else rows) + [row])
            return
        self._append(_lines(self.columns, [row], header=False))

    def _append(self, line: str) -> None:
        """Append and flush one CSV line; on failure cut the torn line off and raise naming the file."""
        assert self._file is not None  # log() refused a closed sink
        try:
            append_whole(self._file, self.path, line, "the CSV file")
        except OSError:
            self._file = None
            raise

    def summary(self, values: dict) -> None:
        """Nothing to do: end-of-run values live in summary.json (JsonlSink)."""

    def close(self, status: str = "finished") -> None:
        """fsync and close the file; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
