"""Causal self-attention choices; see `gptlab.model` for the contract.

One class, `GroupedQueryAttention`, covers mha (n_kv_head = n_head), gqa, mqa (n_kv_head = 1), sliding
windows and hybrids (a window on some layers, full attention on others); the YAML files in
conf/attention/ are named presets of it. `impl` picks the kernel (see `kernels.py`).
"""
