"""Sum over the middle dim with keepdim: KernelBench level 1 problem 47
("Sum_reduction_over_a_dimension"), ``torch.sum(x, dim=1, keepdim=True)``. On a GPU
16 x 1024 x 4095 fp32 (256 MiB; KernelBench has 128 x 4096 x 4095, 8.6 GB); the reduced dim is
strided, the inner one odd."""

import torch
import torch.nn as nn

batch_size = 4
dim1 = 64
dim2 = 63
reduce_dim = 1


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim, keepdim=True)


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return [reduce_dim]
