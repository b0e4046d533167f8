"""``nn.Linear`` with bias, GELU, then softmax over the features: KernelBench level 2 problem 99
("Matmul_GELU_Softmax") at its own sizes on a GPU: batch 1024, 8192 -> 8192, fp32, TF32 off."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 16
in_features = 64
out_features = 48


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = self.linear(x)
        x = F.gelu(x)
        x = F.softmax(x, dim=1)
        return x


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
