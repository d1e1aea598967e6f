"""Plain size/shape settings of a GPT (the `model` config group), free of Hydra.

GPTConfig is also the schema of the `model.*` keys: each field's annotation and `rule` give the key's type and
allowed range (gptlab/config/schema.py derives the checks); the values and their comments live in conf/model/*.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gptlab.errors import ConfigError
from gptlab.util.checks import Number, OneOf, rule

NEEDED = rule(">= 1", required=True)  # a size every model config must state
PARAMETRIZATION = OneOf(("sp", "mup"))  # model.parametrization (gptlab/model/parametrization.py)
BASE_WIDTH = Number(">= 1", int, null=True, note="null = none, refused under mup")


@dataclass(frozen=True)
class GPTConfig:
    """Sizes shared by every block; component choices are passed to GPT separately."""

    n_layer: int = field(default=4, metadata=NEEDED)
    n_head: int = field(default=4, metadata=NEEDED)
    d_model: int = field(default=128, metadata=NEEDED)
    block_size: int = field(default=256, metadata=NEEDED)
    # the config may say null (= the tokenizer's vocabulary, filled in by gptlab.config.build.model_config)
    vocab_size: int = field(default=50257, metadata=rule(check=Number(">= 1", int, null=True)))
    # null = exactly vocab_size rows; N = the embedding and LM head allocate vocab_size rounded up to a multiple of N
    # (64: 50257 -> 50304, friendlier matmul shapes); the extra ids are never predicted (see GPT.forward)
    vocab_multiple: int | None = field(default=None, metadata=rule(check=Number(">= 1", int, null=True)))
    tie_embeddings: bool = True
    bias: bool = False
    dropout: float = field(default=0.0, metadata=rule("[0, 1)", required=True))
    init_std: float = field(default=0.02, metadata=rule(">= 0", required=True))
    # std of every matrix that writes into the residual stream (attention out, MLP down); null = GPT-2's
    # init_std/√(2·n_layer); 0 = start each block as the identity (attention-only recall: docs/ASSOC_RECALL.md)
    residual_init_std: float | None = field(
        default=None, metadata=rule(check=Number(">= 0", float, null=True, note="null = init_std/√(2·n_layer)"))
    )
    # sp: one init and one lr whatever the width; mup: maximal update parametrization, the hyper-parameters tuned at
    # d_model = mup_base_width hold at any width (gptlab/model/parametrization.py)
    parametrization: str = field(default="sp", metadata={**rule(check=PARAMETRIZATION), "omit_default": True})
    # the d_model the hyper-parameters were tuned at (mup only); no default: the model's own d_model would make every
    # width its own base (m = 1), muP without any transfer. omit_default: at their defaults neither enters the model
    # fingerprint (gptlab/model/fingerprint.py), so a model built before they existed keeps its fingerprint
    mup_base_width: int | None = field(default=None, metadata={**rule(check=BASE_WIDTH), "omit_default": True})

    def __post_init__(self) -> None:
        PARAMETRIZATION("model.parametrization", self.parametrization)
        BASE_WIDTH("model.mup_base_width", self.mup_base_width)
        if self.parametrization == "mup" and self.mup_base_width is None:
            raise ConfigError(
                "model.mup_base_width=null: model.parametrization=mup scales by d_model / the width its "
                "hyper-parameters were tuned at; allowed: an integer >= 1 (e.g. the smallest width of a ladder)"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def padded_vocab(self) -> int:
        """Rows the embedding and LM head allocate: vocab_size, rounded up to a multiple of vocab_multiple if set."""
        if self.vocab_multiple is None:
            return self.vocab_size
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple
