"""LayerNorm over a (64, 256, 256) normalized shape (KernelBench L1 #40 at its own size): 16 rows
of 4194304 floats (268 MB), so each row is split across programs and its statistics combined."""

import torch
import torch.nn as nn

batch_size = 2
features = 4
dim1 = 64
dim2 = 96


class Model(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


def get_inputs():
    return [torch.randn(batch_size, features, dim1, dim2)]


def get_init_inputs():
    return [(features, dim1, dim2)]
