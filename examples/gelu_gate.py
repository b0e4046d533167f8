"""A fused elementwise chain: tanh-GELU of (x + bias), gated by sigmoid(x)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 32
dim = 1024


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x + self.bias, approximate="tanh") * torch.sigmoid(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
