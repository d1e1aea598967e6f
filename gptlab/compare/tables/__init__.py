"""The tables a comparison computes: the main table, equal compute, curves, MFU, steps to a target, thresholds, probes, evals, decode."""
