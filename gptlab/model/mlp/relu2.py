"""The squared-ReLU MLP (Primer): d_model -> ratio·d_model -> relu(x)² -> d_model."""

import torch

from gptlab.model.mlp import TwoMatrixMLP


class Relu2MLP(TwoMatrixMLP):
    """Two matrices with relu(x)² between them."""

    def activation(self, h):
        return torch.relu(h).square()
