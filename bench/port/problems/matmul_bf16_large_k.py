"""A bf16 product with few output tiles and a long K (KernelBench L1 #6's shape in bf16):
``A @ B`` with A (256, K), B (K, 256), on a GPU K = 524288 (68.7 GFLOP): 4 output tiles of
128 x 128, so K must be split across programs to occupy the GPU."""

import torch
import torch.nn as nn

M = 32
N = 48
K = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(M, K, dtype=torch.bfloat16), torch.randn(K, N, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
