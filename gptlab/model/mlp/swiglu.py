"""SwiGLU MLP: down(silu(gate(x)) * up(x)), three matrices."""

from __future__ import annotations

import logging
from typing import Annotated

import torch.nn as nn
import torch.nn.functional as F

from gptlab.errors import ConfigError
from gptlab.model.base import MLP
from gptlab.model.mlp import Dropout, Ratio, check_ratio, init_mlp
from gptlab.util.checks import rule

log = logging.getLogger(__name__)


def swiglu_hidden(d_model: int, ratio: float, match_params: bool, multiple_of: int) -> int:
    """Hidden width: ratio·d, or 2/3 of it (rounded up to multiple_of) to match a 2-matrix MLP's params."""
    if isinstance(multiple_of, bool) or not isinstance(multiple_of, int) or multiple_of < 1:
        raise ConfigError(
            f"mlp.multiple_of={multiple_of!r} must be a positive integer (the hidden width is rounded up to it)"
        )
    hidden = ratio * d_model
    if match_params:
        hidden = 2 * hidden / 3
        return int(multiple_of * -(-int(round(hidden)) // multiple_of))
    return int(round(hidden))


class SwiGLU(MLP):
    """Gated MLP; with match_params it keeps the parameter count of the GELU MLP of the same ratio."""

    def __init__(
        self,
        d_model: int,
        bias: bool = False,
        ratio: Ratio = 4,
        match_params: bool = True,
        multiple_of: Annotated[int, rule(">= 1")] = 64,
        dropout: Dropout = 0.0,
    ):
        check_ratio(ratio)
        super().__init__(d_model, swiglu_hidden(d_model, ratio, match_params, multiple_of), dropout)
        # what the hidden width keeps: private, so it stays out of the model fingerprint (the same widths are the same
        # model whichever way they were asked for)
        self._invariant = "params (hidden = 2/3·ratio·d_model)" if match_params else "hidden width (ratio·d_model)"
        self.gate = nn.Linear(d_model, self.hidden, bias=bias)
        self.up = nn.Linear(d_model, self.hidden, bias=bias)
        self.down = nn.Linear(self.hidden, d_model, bias=bias)
        self.drop = nn.Dropout(dropout)

    @property
    def invariant(self) -> str:
        """What mlp.match_params keeps equal to the GELU MLP of the same ratio: its params or its hidden width."""
        return self._invariant

    def init_weights(self, n_layer: int, std: float) -> None:
        init_mlp([self.gate, self.up], self.down, n_layer, std)

    def residual_projections(self) -> list[nn.Linear]:
        return [self.down]

    def forward(self, x):
        return self.drop(self.down(F.silu(self.gate(x)) * self.up(x)))
