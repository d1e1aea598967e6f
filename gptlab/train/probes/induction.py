"""Induction / copying: a random token sequence shown twice; accuracy of continuing it on its second occurrence.

Each sequence is L distinct random tokens of the run's vocabulary, then the same L again (2·L <= the training
length; L = min(length // 2, vocab_size)). Scored: every position of the second copy but its last, whose target is
the token that followed the same token in the first copy (L - 1 per sequence). Distinct tokens make that answer
unique, so a model that copies "what followed this token before" scores 1.0; chance is 1/vocab_size. Key:
`probe/induction/acc`.
"""

from __future__ import annotations

from typing import Annotated

import torch

from gptlab.data.streams import stream_generator
from gptlab.errors import ConfigError
from gptlab.train.probes.score import IGNORE, answers, set_fingerprint
from gptlab.util.checks import rule


def repeated(seed: int, count: int, half: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) (count, 2·half): sequence i = r r with r `half` distinct ids from stream (seed, probe-induction, i)."""
    xs = []
    for i in range(count):
        r = torch.randperm(vocab, generator=stream_generator(seed, "probe-induction", i))[:half]  # (half,)
        xs.append(torch.cat([r, r]))
    x = torch.stack(xs)  # (count, 2·half)
    y = torch.full_like(x, IGNORE)
    y[:, half:-1] = x[:, half + 1 :]  # the second copy predicts its own next token, known from the first copy
    return x, y


class InductionProbe:
    """Next-token accuracy on the second occurrence of a repeated random sequence, on a fixed set from data_seed."""

    name = "induction"

    def __init__(self, *, seed: int, data, model=None, sequences: Annotated[int, rule(">= 1")] = 16):
        vocab, seq_len = int(data.vocab_size), int(data.seq_len)
        half = min(seq_len // 2, vocab)
        if half < 2:
            raise ConfigError(
                f"probes.induction: needs a training length >= 4 and >= 2 tokens; this run has length {seq_len} "
                f"and {vocab} tokens; allowed: drop induction from probes"
            )
        self.x, self.y = repeated(seed, sequences, half, vocab)
        self.fingerprint = set_fingerprint("induction", self.x, self.y)

    def measure(self, model, hardware, tokens_per_forward: int) -> dict[str, float]:
        """{probe/induction/acc: accuracy} over the fixed set."""
        correct = answers(model, self.x, self.y, hardware, tokens_per_forward)
        return {"probe/induction/acc": int(correct.sum()) / int((self.y != IGNORE).sum())}
