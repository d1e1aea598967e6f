"""The validation-set table in words: each data.val_sets set's loss per arm, better / worse as for val loss (lower
is better), in the probe table's cells."""

from __future__ import annotations

from gptlab.compare.render.extra_table import ExtraTable
from gptlab.compare.render.probes import cell_text
from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.tables.val_sets import ValSetRow


def table(rows: list[ValSetRow]) -> tuple[list[str], list[list[str]]]:
    """Headers (the set, then each arm) and one line of display strings per set."""
    headers = ["validation set", *(c.label for c in rows[0].cells)] if rows else []
    return headers, [[r.metric, *(cell_text(c, "lower") for c in r.cells)] for r in rows]


NOTE = (
    "Validation-set table: each extra validation set's loss (data.val_sets, val/<name>/loss) at the compared point, "
    f"mean ± std over seeds; Δ vs the baseline with Welch's t-test as for val loss (p < {ALPHA}: better/worse, lower "
    "is better); every run scored a row on the same set (summary.json val_sets: fingerprint and sequences)."
)


def extra_table(rows: list[ValSetRow]) -> ExtraTable | None:
    """The validation-set table for the report (None without sets)."""
    if not rows:
        return None
    headers, body = table(rows)
    title = "validation sets (mean ± std over seeds; Δ vs baseline, Welch)"
    return ExtraTable("Validation sets", title, "val-sets", headers, body, NOTE)
