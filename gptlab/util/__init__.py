"""Leaf helpers every room uses: strict JSON and atomic writes, nested-dict flattening, shipped paths, value rules."""
