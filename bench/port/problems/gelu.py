"""Exact (erf) GELU of a 2-D fp32 tensor: KernelBench level 1 problem 26 ("GELU_"), at
8192 x 16384 (512 MiB) on a GPU instead of KernelBench's 4096 x 393216 (6.4 GB)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 16
dim = 1000


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
