"""Square matrix product C = A @ B: KernelBench level 1 problem 1 ("Square_matrix_multiplication_").

KernelBench draws A and B in the default dtype, fp32 (``torch.rand(N, N)``), with N = 2048 * 2 =
4096; so does this problem on a GPU (``[sizes.cuda]``). TF32 is off in the sidecar: the product is
held to fp32 accuracy, eager and torch.compile are timed with TF32 off too.
"""

import torch
import torch.nn as nn

N = 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs():
    return []
