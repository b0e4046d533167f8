"""Matrix product with irregular shapes: KernelBench level 1 problem 8
("Matmul_with_irregular_shapes_"), M = 8205, K = 2949, N = 5921 in fp32 on a GPU."""

import torch
import torch.nn as nn

M = 67
K = 45
N = 53


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
