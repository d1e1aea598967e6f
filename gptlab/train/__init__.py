"""One training run: run (validate -> build -> resume -> train -> summarise), bundle, loop, loss, prefetch, signals,
diagnostics and anomaly replay, probes, and profile (profile=true: a few real steps of the same objective timed)."""
