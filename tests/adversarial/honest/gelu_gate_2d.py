"""Honest: the gelu-gate chain on a 2-D grid of (row block, column block) tiles, with the
bias loaded once per column tile and the tanh written out explicitly."""
# reference: gelu_gate

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK_M = 4
BLOCK_N = 256


@triton.jit
def gelu_gate_2d_kernel(out_ptr, x_ptr, bias_ptr, n_rows, n_cols,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    bias = tl.load(bias_ptr + cols, mask=cols < n_cols, other=0.0)
    u = x + bias[None, :]
    z = 0.7978845608028654 * (u + 0.044715 * u * u * u)
    t = 2.0 / (1.0 + tl.exp(-2.0 * z)) - 1.0          # tanh(z)
    gelu = 0.5 * u * (1.0 + t)
    tl.store(out_ptr + offs, gelu * (1.0 / (1.0 + tl.exp(-x))), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty_like(x2)
        n_rows, n_cols = x2.shape
        grid = (triton.cdiv(n_rows, BLOCK_M), triton.cdiv(n_cols, BLOCK_N))
        gelu_gate_2d_kernel[grid](out, x2, self.bias, n_rows, n_cols, BLOCK_M=BLOCK_M,
                                  BLOCK_N=BLOCK_N)
        return out.reshape(x.shape)
