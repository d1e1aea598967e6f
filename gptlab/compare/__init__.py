"""Compare run directories at an equal step: grouping by seed, labels, Welch verdicts, reports (no training imports)."""
