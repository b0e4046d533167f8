"""A strided transposed Conv2d, a per-channel bias subtracted, then tanh: KernelBench level 2
problem 5 ("ConvTranspose2d_Subtract_Tanh"), stride 2, padding 1, output padding 1. On a GPU its
sizes (64 -> 64 channels, 256 x 256 images, 4 x 4 kernel) with batch 8 instead of 32 (the
output alone would be 2.2 GB), fp32 with TF32 off (69 GFLOP of the convolution's own)."""

import torch
import torch.nn as nn

batch_size = 2
in_channels = 3
out_channels = 8
height = width = 7
kernel_size = 4


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape, stride=2, padding=1, output_padding=1):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, output_padding=output_padding)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv_transpose(x)
        x = x - self.bias
        return torch.tanh(x)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, (out_channels, 1, 1)]
