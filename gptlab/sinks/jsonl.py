"""The local source of truth: `metrics.jsonl` (one JSON object per logged row) and `summary.json`, and the one reader
of summary.json (`read_summary`: every figure range-checked, a damaged file refused in one line)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import IO

from gptlab.errors import ConfigError
from gptlab.util.io import append_whole, atomic_write_text, strict_json
from gptlab.util.stored import Check, read_json

log = logging.getLogger(__name__)
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
STATUSES = ("finished", "failed", "preempted", "interrupted", "pruned", "running")  # what close(status) records
# summary figures that are counts, sizes, times, rates or losses: never negative (null: measured, not finite)
NON_NEGATIVE = (
    "steps", "tokens", "params", "flops", "flops_per_token", "peak_mem_bytes", "wall_s", "train_s", "tokens_per_s_median",
    "step_ms_median", "data_ms_median", "mfu_median", "peak_flops", "seq_len", "batch_size", "final_val_loss",
    "best_val_loss",
)  # fmt: skip
SUMMARY_FIX = (
    "resume the run (gptlab-train with its config, train.resume=auto) to write it again from its checkpoint, or "
    "leave the run out"
)


def read_summary(path: Path, fix: str = SUMMARY_FIX) -> dict:
    """The summary.json at `path` ({} when there is none); not JSON, not an object, an unknown status or a figure
    that is not a finite non-negative number is a one-line ConfigError naming the file and what to do (`fix`)."""
    check = Check(Path(path), fix)
    summary = read_json(path, check.fix, missing={})
    if not isinstance(summary, dict):
        raise check.fail(f"expected a JSON object, got {type(summary).__name__}")
    if "status" in summary:
        check.one_of("status", summary["status"], STATUSES)
    for key in NON_NEGATIVE:
        value = summary.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise check.fail(f"{key}={value!r} is not a number")
        check.number(key, value, ">= 0", null=True)
    check.number("outside_load", summary.get("outside_load"), "[0, 1]", null=True)  # a share of the cores
    return summary


def read_summary_or_warn(path: Path, logger: logging.Logger, what: str) -> dict:
    """read_summary for a writer about to replace the file: a damaged one is logged (`what` happens to it instead)
    and read as {}, never replaced without a word."""
    try:
        return read_summary(path, what)
    except ConfigError as err:
        logger.warning("%s", err)
        return {}


def read_rows(path: Path) -> list[dict]:
    """The complete rows of a metrics file; a torn last line (killed mid-write) is skipped."""
    rows: list[dict] = []
    if not path.exists():
        return rows
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
    return rows


class JsonlSink:
    """Appends `{"step": step, **metrics}` lines to run_dir/metrics.jsonl and keeps run_dir/summary.json.

    resume=False starts the run's files afresh (a dir restarted from step 0 drops stale rows and
    summary); resume=True keeps them, and the loop then calls `truncate_after(resumed_step)`.
    """

    def __init__(self, run_dir: str | os.PathLike, resume: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / METRICS_FILE
        self.summary_path = self.run_dir / SUMMARY_FILE
        self._summary: dict = {}
        self._closed = False
        for stale in self.run_dir.glob(".*.tmp"):  # left by a process killed mid-write (one writer per run dir)
            if stale.name.startswith((f".{METRICS_FILE}.", f".{SUMMARY_FILE}.")):
                stale.unlink(missing_ok=True)
        if resume:
            self._summary = self._read_summary()
            self._rewrite(read_rows(self.metrics_path))  # drops a torn last line before appending
        else:
            self.metrics_path.write_text("", encoding="utf-8")
            self.summary_path.unlink(missing_ok=True)
        self._file: IO[str] | None = open(self.metrics_path, "a", encoding="utf-8")

    def _read_summary(self) -> dict:
        """The existing summary.json, or {} when it is missing (damaged: {} with a warning; the run rewrites it)."""
        return read_summary_or_warn(self.summary_path, log, "the resumed run writes it again")

    def _rewrite(self, rows: list[dict]) -> None:
        """Atomically replace metrics.jsonl with `rows`."""
        text = "".join(json.dumps(row) + "\n" for row in rows)
        atomic_write_text(self.metrics_path, text)

    def truncate_after(self, step: int) -> int:
        """Drop rows with step > `step` so a resume from `step` continues the curve; returns rows kept."""
        if self._file is not None:
            self._file.close()
        kept = [row for row in read_rows(self.metrics_path) if row["step"] <= step]
        self._rewrite(kept)
        self._file = open(self.metrics_path, "a", encoding="utf-8")
        return len(kept)

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Append one line and flush it, so a killed run keeps every row logged before the kill."""
        if self._file is None:
            raise RuntimeError(f"JsonlSink for {self.run_dir} is closed")
        row = {"step": int(step), **{k: strict_json(v) for k, v in metrics.items() if k != "step"}}
        try:  # disk full: the torn row is cut off, every whole one kept, the file named
            append_whole(self._file, self.metrics_path, json.dumps(row) + "\n", "the metrics file")
        except OSError:
            self._file = None
            raise

    def summary(self, values: dict) -> None:
        """Merge `values` into summary.json and rewrite it atomically."""
        self._summary.update(strict_json(dict(values)))
        atomic_write_text(self.summary_path, json.dumps(self._summary, indent=2, sort_keys=True) + "\n")

    def close(self, status: str = "finished") -> None:
        """Record `status` in summary.json, fsync and close metrics.jsonl; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        if self._file is not None:  # None after a failed append: the summary still records the status
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
        self.summary({"status": status})
