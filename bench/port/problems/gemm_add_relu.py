"""GEMM (bias-free ``nn.Linear``), add a bias parameter, ReLU: KernelBench level 2 problem 76
("Gemm_Add_ReLU") at its own sizes on a GPU: batch 1024, 8192 -> 8192 features, fp32 with TF32
off (137 GFLOP)."""

import torch
import torch.nn as nn

batch_size = 16
in_features = 64
out_features = 48


class Model(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.gemm(x)
        x = x + self.bias
        x = torch.relu(x)
        return x


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, [out_features]]
