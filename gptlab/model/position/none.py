"""No positional information (NoPE): causal masking alone tells the model about order."""

from gptlab.model.position import Position


class NoPosition(Position):
    """Every hook is the identity."""
