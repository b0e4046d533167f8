"""Conv3d, Mish, then tanh: KernelBench level 2 problem 47 ("Conv3d_Mish_Tanh"). On a GPU its own
sizes (batch 16, 32 -> 64 channels, 32 x 64 x 64 volumes, 3 x 3 x 3 kernel), fp32 with TF32 off
(204 GFLOP): a 3-D convolution, which Inductor hands to cuDNN."""

import torch
import torch.nn as nn

batch_size = 2
in_channels = 3
out_channels = 8
D, H, W = 6, 8, 8
kernel_size = 3


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)

    def forward(self, x):
        x = self.conv(x)
        x = torch.nn.functional.mish(x)
        return torch.tanh(x)


def get_inputs():
    return [torch.randn(batch_size, in_channels, D, H, W)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
