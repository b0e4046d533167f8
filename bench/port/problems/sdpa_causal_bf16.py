"""Causal scaled dot-product attention in bf16 at a decoder's shape: B 8, H 16, S 2048, D 64
(137 GFLOP as PyTorch's flop counter counts it, without the mask; half of that is computed)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch = 1
heads = 2
seq = 80
head_dim = 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def get_inputs():
    shape = (batch, heads, seq, head_dim)
    return [torch.randn(shape, dtype=torch.bfloat16) for _ in range(3)]


def get_init_inputs():
    return []
