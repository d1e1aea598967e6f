"""Length extrapolation: val loss at 1x, 2x and 4x the training length, on the very same tokens.

The set is `windows` windows of max(factors) x T tokens from the val split (T = the training length), on their own
stream from data_seed. At factor f each window is cut into max/f sequences of f·T tokens, so every factor scores
exactly the same targets and only the context the model sees differs (how far back it may look, and how far past T
its positions run). Keys: `probe/length/1x/loss`, `probe/length/2x/loss`, ...

A position choice with a table of block_size rows (position=learned) has no position past it: such a run measures
1x only and says so in one warning line when the probe is built (the other keys are absent, never a made-up
number). RoPE, ALiBi, sinusoidal and no positions compute each position's encoding (or bias) from the position
itself, so the model runs at any length without changing how it trains. Needs a text data choice (a val split).
"""

from __future__ import annotations

import logging
from typing import Annotated

import torch.nn as nn

from gptlab.errors import ConfigError
from gptlab.train.probes.score import mean_loss, set_fingerprint
from gptlab.util.checks import Number, Seq, rule

log = logging.getLogger(__name__)


def extrapolates(model) -> bool:
    """Whether the model's positions exist past block_size: no learned table (an nn.Embedding) in its position."""
    position = getattr(model, "position", None)
    return position is None or not any(isinstance(m, nn.Embedding) for m in position.modules())


class LengthProbe:
    """Val loss at factors x the training length, each factor scoring the same tokens."""

    name = "length"

    def __init__(
        self,
        *,
        seed: int,
        data,
        model=None,
        factors: Annotated[list | tuple, rule(check=Seq(Number(">= 1", int)))] = (1, 2, 4),
        windows: Annotated[int, rule(">= 1")] = 4,
    ):
        wanted = sorted({int(f) for f in factors})
        top, seq_len = wanted[-1], int(data.seq_len)
        if any(top % f for f in wanted):
            raise ConfigError(f"probes.length.factors={wanted}: each must divide the largest ({top})")
        if not hasattr(data, "long_val_samples"):
            raise ConfigError(
                f"probes.length: needs a text data choice (a val split to cut long windows from); data={data.name} "
                "has none; allowed: drop length from probes"
            )
        if not extrapolates(model) and top > 1:
            log.warning(
                "probes.length: this position choice has a learned table of model.block_size=%d rows and no position "
                "past it: only 1x is measured (not %s)",
                seq_len,
                ", ".join(f"{f}x" for f in wanted if f > 1),
            )
            wanted = [1]
        self.factors, self.top, self.seq_len = wanted, top, seq_len
        self.x, self.y = data.long_val_samples(windows, top * seq_len)  # (windows, top·T) each
        self.fingerprint = set_fingerprint("length", self.x, self.y)  # the same set whichever factors are measured

    def measure(self, model, hardware, tokens_per_forward: int) -> dict[str, float]:
        """{probe/length/<f>x/loss: token-weighted mean loss} at each factor, over the same targets."""
        out = {}
        for f in self.factors:
            length = f * self.seq_len
            x, y = self.x.reshape(-1, length), self.y.reshape(-1, length)  # (windows·top/f, f·T)
            out[f"probe/length/{f}x/loss"] = mean_loss(model, x, y, hardware, tokens_per_forward)
        return out
