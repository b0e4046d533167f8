"""Conv2d, ReLU, then a per-channel bias add: KernelBench level 2 problem 1 ("Conv2D_ReLU_BiasAdd").
On a GPU its sizes (64 -> 128 channels, 128 x 128 images, 3 x 3 kernel) with batch 32 instead of
128, fp32 with TF32 off (75 GFLOP; cuDNN would use TF32 by default, the sidecar says not to)."""

import torch
import torch.nn as nn

batch_size = 2
in_channels = 3
out_channels = 8
height = width = 16
kernel_size = 3


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv(x)
        x = torch.relu(x)
        x = x + self.bias
        return x


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, [out_channels, 1, 1]]
