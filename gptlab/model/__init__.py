"""The GPT model and its interchangeable parts, one sub-package per config group.

Contracts: each family has a base class in `gptlab.model.base`; a variant subclasses it and calls
`super().__init__(...)`, which sets every attribute the rest of gptlab reads. GPT refuses, in one line,
a component that is not an instance of its family's base or lacks those attributes.

- attention (`base.Attention`): built as `cls(d_model, n_head, block_size, layer_idx, norm, *, bias,
  **choice_keys)`; `super().__init__(d_model, n_head, block_size, layer_idx, *, n_kv_head=None, window=None,
  impl="sdpa", dropout=0.0)` sets `n_head n_kv_head head_dim window impl kernel dropout` (whether scores get a
  bias is the position's `has_score_bias`, read from the model). Defines `init_weights(n_layer, std)` and
  `forward(x, position, cache=None)`: (B, T, d_model) -> (B, T, d_model), causal; `self.attend(q, k, v,
  position, cache)` takes q (B, n_head, T, head_dim), k/v (B, n_kv_head, T, head_dim) and applies the
  position hooks, the KV cache, the causal/window mask, dropout and `impl`'s kernel. Every nn.Linear inside
  is costed as applied once per token. Optional classmethod `layer_key(layer_idx, **choice_keys)`: layers
  with equal keys are identical, so the cost model builds one of each (default: every layer its own kind).
  Optional `residual_projections()`: the nn.Linear(s) that write into the residual stream, which
  `model.residual_init_std` re-draws (a choice without it is refused when that key is set).
- mlp (`base.MLP`): `cls(d_model, *, bias, **choice_keys)`; `super().__init__(d_model, hidden, dropout)`;
  `init_weights(n_layer, std)`; `residual_projections()` as for attention; (B, T, d) -> (B, T, d), token by token.
- norm (`base.Norm`): the YAML names a factory `f(dim, **choice_keys) -> Norm`; `super().__init__(dim, eps,
  centered)`; `reset_parameters()`; (..., dim) -> (..., dim). Used for the blocks and for QK-norm.
- position (`base.Position`): `cls(d_model, n_head, head_dim, block_size, **choice_keys)`, identity hooks
  `embed(x, pos)`, `rotate(q, k, pos)`, `score_bias(q_pos, k_pos)` and `init_weights(std)`; a variant
  overrides the ones it needs and sets the class attribute `has_score_bias = True` if it biases scores.
- packed documents (data.doc_mask, `gptlab.model.documents.Documents`): `GPT.forward(idx, targets, docs=ids)`
  hands the blocks a Documents where the Position goes; `Attention.attend` then gives the hooks `pos` (B, T), each
  token's position within its document (so every hook takes (T,) or (B, T) positions), and the kernel `docs=`,
  whose mask keeps every query inside its document. An attention that does not call `attend` must do both itself.

Under model.parametrization=mup (gptlab/model/parametrization.py) an attention needs a `mup_q_scale` attribute
(class-level None; set to 1/√head_dim) that scales q before `attend`, and any component may define `mup_roles()`
-> {its own parameter name: input | hidden | output | vector} where the default roles misread its parameters.

Adding a variant: write `gptlab/model/mlp/geglu.py` with a class honouring the contract, add
`conf/mlp/geglu.yaml` with `_target_: gptlab.model.mlp.geglu.GeGLU` and `_partial_: true`, and the
glob-driven tests pick it up (`pytest tests/test_contracts.py tests/test_model_zoo.py`).
"""
