"""Square fp32 matrix product (KernelBench level 1, problem 1 style). TF32 is off: the oracle
holds a candidate to true fp32 accuracy, so a TF32 or bf16 shortcut is rejected."""

import torch
import torch.nn as nn

N = 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs():
    return []
