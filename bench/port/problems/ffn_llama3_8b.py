"""The Llama-3-8B feed-forward block, ``w2(silu(w1(x)) * w3(x))`` with bias-free ``nn.Linear``
layers in bf16: on a GPU x is 4096 tokens x 4096 (dim), the hidden size 14336 (3 x 241 GFLOP)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

tokens = 8
dim = 64
hidden = 128


class Model(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False, dtype=torch.bfloat16)
        self.w2 = nn.Linear(hidden, dim, bias=False, dtype=torch.bfloat16)
        self.w3 = nn.Linear(dim, hidden, bias=False, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def get_inputs():
    return [torch.randn(tokens, dim, dtype=torch.bfloat16)]


def get_init_inputs():
    return [dim, hidden]
