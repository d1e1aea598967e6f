"""No positional information (NoPE): causal masking alone tells the model about order."""

from gptlab.model.base import Position


class NoPosition(Position):
    """Every hook is the identity."""
