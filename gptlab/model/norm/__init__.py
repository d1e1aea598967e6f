"""Normalisation choices: each YAML names a factory `f(dim) -> nn.Module` (used for blocks and QK-norm)."""
