"""TensorBoard sink: metric curves, the flat config and the end-of-run summary in <run_dir>/<log_dir>."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from gptlab.util.checks import rule
from gptlab.util.tree import flatten

EVENT_PREFIX = "events.out.tfevents."
# HParams: the settings beside the choices that tell runs of a sweep apart, and the final numbers to sort them by.
HPARAM_KEYS = (
    "arm", "sweep", "seed", "data_seed", "optimizer.lr", "optimizer.weight_decay", "train.batch_size",
    "train.max_steps", "model.n_layer", "model.d_model", "model.n_head", "attention.n_kv_head", "mlp.ratio",
)  # fmt: skip
HPARAM_METRICS = (
    "final_val_loss", "best_val_loss", "tokens_per_s_median", "step_ms_median", "mfu_median", "peak_mem_bytes",
    "params",
)  # fmt: skip
_STAMP = re.compile(r"^events\.out\.tfevents\.(\d+)\.")


def _number(value: Any) -> float | None:
    """`value` as a float when it is a real number (tensors and numpy scalars too), else None; bools are not numbers."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def markdown_table(values: Mapping[str, Any]) -> str:
    """A two-column `key | value` markdown table (TensorBoard's text tab renders markdown), keys sorted."""
    lines = ["| key | value |", "|---|---|"]
    for key, value in sorted(values.items()):
        cell = str(value).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {key} | {cell} |")
    return "\n".join(lines)


def _wait_to_sort_last(log_dir: Path) -> None:
    """Sleep until the clock passes the newest event file's second, so a new file sorts after it.

    TensorBoard reads a folder's event files in name order and a name starts with the second its
    writer opened; a resume within that same second (in-process, as tests do) would sort wrongly.
    """
    stamps = [int(m.group(1)) for p in log_dir.glob(EVENT_PREFIX + "*") if (m := _STAMP.match(p.name))]
    if stamps:
        delay = max(stamps) + 1 - time.time()
        if delay > 0:
            time.sleep(delay)


class TensorboardSink:
    """Writes every numeric metric as a TensorBoard scalar (tag = metric key, x = optimizer step).

    - config: the flat config is written once per writer, as the markdown table text "config" at the
      first step this process logs (a resumed run adds a second table at its resume step).
    - summary: at close, numeric values become scalars `summary/<key>` at the last logged step, and the
      non-numeric ones (status, choices.*, fingerprints, ...) one markdown table text "summary"; the HParams
      dashboard gets the choices and key settings against the final numbers.
    - non-finite values (NaN, inf) are logged as they are: TensorBoard keeps them and marks them on the
      chart as triangles, so a diverged run shows where it diverged. Non-numeric metric values are skipped.
    - resume: `truncate_after(step)` makes the next writer open with purge_step=step+1, so readers
      hide every older event after `step` (the stale tail the resumed run logs again). resumed=False
      deletes earlier event files in the folder: a run restarted from scratch starts a fresh log.

    Write errors raise out of the sink (SafeSink upstream turns them into one warning).
    """

    REQUIRES = (("tensorboard", "tensorboard"),)  # (module, gptlab extra): checked when the run is validated

    def __init__(
        self,
        run_dir: str | os.PathLike,
        config: Mapping[str, Any] | None = None,
        resumed: bool = False,
        log_dir: str = "tensorboard",
        flush_secs: Annotated[float, rule("> 0")] = 30,
        **_ignored: Any,
    ) -> None:
        # _ignored: build code passes name, group, tags, ... to every logger partial.
        self.log_dir = Path(run_dir) / log_dir
        self.config = flatten(dict(config or {}))
        self.resumed = resumed
        self.flush_secs = flush_secs
        self.writer: Any = None
        self._purge_step: int | None = None
        self._last_step: int | None = None
        self._summary: dict[str, Any] = {}
        self._closed = False
        if not resumed and self.log_dir.is_dir():
            for old in self.log_dir.glob(EVENT_PREFIX + "*"):
                old.unlink()

    def truncate_after(self, step: int) -> None:
        """Hide events after `step` from readers: the next writer opens with purge_step=step+1."""
        self._close_writer()
        self._purge_step = int(step) + 1

    def _open(self, step: int) -> None:
        """Open the writer (lazily, on first use) and write the config table at `step`."""
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        if self.log_dir.is_dir():
            _wait_to_sort_last(self.log_dir)
        self.writer = SummaryWriter(str(self.log_dir), purge_step=self._purge_step, flush_secs=self.flush_secs)
        self._purge_step = None
        if self.config:
            self.writer.add_text("config", markdown_table(self.config), global_step=step)

    def _close_writer(self) -> None:
        """Flush and close the current writer, if one is open."""
        if self.writer is not None:
            writer, self.writer = self.writer, None
            writer.close()

    def log(self, metrics: dict[str, float], step: int) -> None:
        """One scalar per numeric metric at global_step=step."""
        if self._closed:
            raise RuntimeError(f"TensorboardSink for {self.log_dir} is closed")
        step = int(step)
        if self.writer is None:
            self._open(step)
        for key, value in metrics.items():
            number = _number(value)
            if key != "step" and number is not None:
                self.writer.add_scalar(key, number, global_step=step)
        self._last_step = step

    def summary(self, values: dict) -> None:
        """Keep end-of-run values (later calls update earlier keys); they are written at close."""
        self._summary.update(flatten(dict(values)))

    def _write_summary(self, status: str) -> None:
        """Numeric summary values as summary/<key> scalars, the rest (and status) as one text table."""
        step = self._last_step if self._last_step is not None else max(self._purge_step or 0, 0)
        if self.writer is None:
            self._open(step)
        text = {"status": status}
        for key, value in self._summary.items():
            number = _number(value)
            if number is None:
                text[key] = value
            else:
                self.writer.add_scalar(f"summary/{key}", number, global_step=step)
        self.writer.add_text("summary", markdown_table(text), global_step=step)
        self._write_hparams(step)

    def _write_hparams(self, step: int) -> None:
        """The HParams dashboard's record of this run: its choices and key settings against its final numbers (the
        summary/<key> scalars above), so runs can be filtered and sorted by choice in TensorBoard."""
        from torch.utils.tensorboard.summary import hparams

        chosen = {**{k.replace("choices.", "choice/"): v for k, v in self._summary.items()}, **self.config}
        params: dict[str, Any] = {}
        for key, value in sorted(chosen.items()):
            if (key.startswith("choice/") and key != "choice/logger") or key in HPARAM_KEYS:
                params[key] = value if isinstance(value, (bool, int, float, str)) else str(value)
        metrics = {f"summary/{k}": v for k in HPARAM_METRICS if (v := _number(self._summary.get(k))) is not None}
        if not params or not metrics:
            return
        file_writer = self.writer._get_file_writer()
        for record in hparams(params, metrics):  # experiment, session start, session end
            file_writer.add_summary(record, step)

    def close(self, status: str = "finished") -> None:
        """Write the summary, flush and close the event file; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.writer is not None or self._summary:
                self._write_summary(status)
        finally:
            self._close_writer()
