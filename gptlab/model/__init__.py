"""The GPT model and its interchangeable parts, one sub-package per config group.

Contracts (each variant is one .py here plus one YAML under conf/<group>/):

- attention (`gptlab.model.attention`): built as `cls(d_model, n_head, block_size, layer_idx, norm,
  **choice_keys)`; `forward(x, position, cache=None)` maps (B, T, d_model) -> (B, T, d_model);
  exposes `n_head`, `n_kv_head`, `head_dim`, `window` (None = full causal, else this layer's window),
  `impl`, linears `qkv` and `proj`, and `init_weights(n_layer, std)`.
- mlp (`gptlab.model.mlp`): `cls(d_model, bias, **choice_keys)`; (B, T, d) -> (B, T, d); exposes
  `hidden` and `init_weights(n_layer, std)`.
- norm (`gptlab.model.norm`): a factory `f(dim) -> nn.Module` normalising the last dimension.
- position (`gptlab.model.position`): `cls(d_model, n_head, head_dim, block_size, **choice_keys)`, a
  `Position` with `embed(x, pos)`, `rotate(q, k, pos)` and `score_bias(q_pos, k_pos)`.

Adding a variant: write `gptlab/model/mlp/geglu.py` with a class honouring the contract, add
`conf/mlp/geglu.yaml` with `_target_: gptlab.model.mlp.geglu.GeGLU` and `_partial_: true`, and the
glob-driven tests pick it up (`pytest tests/test_model_zoo.py`).
"""

from gptlab.model.config import GPTConfig
from gptlab.model.gpt import GPT

__all__ = ["GPT", "GPTConfig"]
