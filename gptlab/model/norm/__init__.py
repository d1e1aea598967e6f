"""Normalisation choices: each YAML names a factory `f(dim) -> gptlab.model.base.Norm` (blocks and QK-norm)."""
