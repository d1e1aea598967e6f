"""The GPT-2 MLP: d_model -> ratio·d_model -> GELU (tanh approximation) -> d_model."""

import torch.nn.functional as F

from gptlab.model.mlp import TwoMatrixMLP


class GeluMLP(TwoMatrixMLP):
    """Two matrices with GELU between them (as in GPT-2)."""

    def activation(self, h):
        return F.gelu(h, approximate="tanh")
