"""Studies over many runs of one sweep: the lr grid, the scale ladder, the factorial design."""
