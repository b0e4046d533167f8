"""An LLM up-projection with bias and tanh-GELU in bf16 (GPT-style MLP's first layer):
``gelu(x Wᵀ + b, approximate="tanh")``. On a GPU 8192 tokens x 4096 -> 16384 (1100 GFLOP)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

tokens = 24
dim = 64
hidden = 96


class Model(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc = nn.Linear(dim, hidden, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.fc(x), approximate="tanh")


def get_inputs():
    return [torch.randn(tokens, dim, dtype=torch.bfloat16)]


def get_init_inputs():
    return [dim, hidden]
