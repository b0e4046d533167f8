"""Triton row softmax: one program per row, the whole row in registers, max-subtracted."""

import torch
import torch.nn as nn
import triton
import triton.language as tl

TUNABLES = {"num_warps": [1, 2, 4, 8, 16]}
num_warps = 8


@triton.jit
def softmax_kernel(out_ptr, in_ptr, n_cols, in_stride, out_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    den = tl.sum(num, axis=0)
    tl.store(out_ptr + row * out_stride + cols, num / den, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        out = torch.empty_like(x2)
        n_rows, n_cols = x2.shape
        block = triton.next_power_of_2(n_cols)
        softmax_kernel[(n_rows,)](out, x2, n_cols, x2.stride(0), out.stride(0),
                                  BLOCK=block, num_warps=num_warps)
        return out.reshape(x.shape)
