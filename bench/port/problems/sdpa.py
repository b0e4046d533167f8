"""Scaled dot-product attention, ``F.scaled_dot_product_attention(Q, K, V)`` (non-causal, no
mask): KernelBench level 1 problem 97 ("ScaledDotProductAttention", fp16 there). Here bf16 at a
Llama-like shape on a GPU: batch 4, 32 heads, sequence 2048, head dim 128 (275 GFLOP)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 1
num_heads = 2
seq_len = 64
head_dim = 32


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(Q, K, V)


def get_inputs():
    shape = (batch_size, num_heads, seq_len, head_dim)
    return [torch.randn(shape, dtype=torch.bfloat16) for _ in range(3)]


def get_init_inputs():
    return []
