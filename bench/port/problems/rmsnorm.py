"""RMS normalisation over the feature dim (dim 1) of a 4-D fp32 tensor, written out as KernelBench
level 1 problem 36 ("RMSNorm_") writes it: ``x / sqrt(mean(x**2, dim=1, keepdim=True) + eps)``.
On a GPU 16 x 64 x 256 x 256 (256 MiB; KernelBench has 112 x 64 x 512 x 512, 7.5 GB)."""

import torch
import torch.nn as nn

batch_size = 2
features = 16
dim1 = 8
dim2 = 8


class Model(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + self.eps)
        return x / rms


def get_inputs():
    return [torch.randn(batch_size, features, dim1, dim2)]


def get_init_inputs():
    return [features]
