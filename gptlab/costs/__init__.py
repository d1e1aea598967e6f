"""The cost model: params, FLOPs, bytes, arithmetic intensity, KV cache, memory and roofline for a GPT.

Pure torch + Python (no Hydra, no W&B): `analyze(model, batch_size, seq_len, mode=...)` reads the
model's module tree, so any attention/MLP/norm/position variant is costed without new code here.
`train_flops_per_token` is the MFU numerator the training loop uses, so the two never disagree.
`Accounting` picks the counting conventions (mask pass, element-wise fusion, blocks only; docs/COSTS.md).
"""
