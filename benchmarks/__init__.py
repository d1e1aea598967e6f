"""Benchmarks of gptlab on the current machine: `python -m benchmarks [--quick] [--out DIR]` (see __main__)."""
