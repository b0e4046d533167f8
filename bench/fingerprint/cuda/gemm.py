"""bf16 GEMM, C = A @ B (KernelBench level 1 style); the GPU sizes are in gemm.toml."""

import torch
import torch.nn as nn

M = 256
N = 256
K = 256


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


def get_inputs():
    return [torch.randn(M, K, dtype=torch.bfloat16), torch.randn(K, N, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
