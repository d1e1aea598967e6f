"""Compare run directories at an equal step: grouping by seed, labels, Welch verdicts, reports (no training imports)."""

from gptlab.compare.analysis import Comparison, Row, compare
from gptlab.compare.claims import load_claims
from gptlab.compare.runs import Run, discover, load_run

__all__ = ["Comparison", "Row", "Run", "compare", "discover", "load_claims", "load_run"]
