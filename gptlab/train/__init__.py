"""One training run: run (validate -> build -> resume -> train -> summarise), bundle, loop, loss, prefetch, signals,
diagnostics and anomaly replay."""
