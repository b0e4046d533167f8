"""LayerNorm over the hidden dimension of (batch, seq, hidden) activations, fp32, with learnt
weight and bias (KernelBench level 1 problem 40's ``nn.LayerNorm``, at a transformer's shape:
4 x 4096 x 4096 on a GPU instead of KernelBench's normalisation over three whole dims)."""

import torch
import torch.nn as nn

batch_size = 2
seq_len = 8
hidden = 512


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden)]


def get_init_inputs():
    return [hidden]
