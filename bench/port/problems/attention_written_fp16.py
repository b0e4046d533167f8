"""Attention written out as model code does, in fp16, with the scale from the head size:
``softmax(q @ kᵀ / sqrt(d), dim=-1) @ v`` for (B, H, S, D) = (4, 32, 1024, 128) on a GPU (eager
materialises the 4 x 32 x 1024 x 1024 scores)."""

import math

import torch
import torch.nn as nn

batch = 1
heads = 2
seq = 72
head_dim = 32


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        return torch.softmax(scores, dim=-1) @ v


def get_inputs():
    shape = (batch, heads, seq, head_dim)
    return [torch.randn(shape, dtype=torch.float16) for _ in range(3)]


def get_init_inputs():
    return []
