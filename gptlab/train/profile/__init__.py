"""profile=true: a few real steps under torch.profiler, per-module timing hooks, tables, and state put back after."""
