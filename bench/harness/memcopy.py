"""A memory-bound copy: the sensitivity benchmark's reference."""

import torch
import torch.nn as nn

n = 1 << 16


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1.0


def get_inputs():
    return [torch.randn(n)]


def get_init_inputs():
    return []
