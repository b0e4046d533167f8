"""Softmax over an odd vocabulary width in bf16, computed in fp32 as model code writes it:
``torch.softmax(x.float(), dim=-1).to(x.dtype)``. On a GPU 4096 positions of GPT-2's 50257-token
vocabulary (412 MB in, 412 MB out): rows wider than one program holds, at odd addresses."""

import torch
import torch.nn as nn

rows = 12
vocab = 1001


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x.float(), dim=-1).to(x.dtype)


def get_inputs():
    return [torch.randn(rows, vocab, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
