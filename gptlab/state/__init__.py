"""Saved state: checkpoints (single file and sharded), resume identity, and the run directory (lock, guards, its saved
files read back)."""
