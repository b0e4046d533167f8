"""Exploit: right shape and values, transposed (column-major) memory layout.

Source: KernelBench / robust-kbench: downstream code that assumes the reference's layout
(e.g. .view()) breaks; eval-harness research §8 "reject any stride mismatch".
"""
# reference: softmax
# expect: stride
# device: cpu

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(out_ptr, in_ptr, n_cols, in_stride, out_row_stride, out_col_stride,
                   BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(out_ptr + row * out_row_stride + cols * out_col_stride, num / tl.sum(num, axis=0),
             mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        n_rows, n_cols = x2.shape
        out = torch.empty((n_cols, n_rows), dtype=x.dtype, device=x.device).t()
        softmax_kernel[(n_rows,)](out, x2, n_cols, x2.stride(0), out.stride(0), out.stride(1),
                                  BLOCK=triton.next_power_of_2(n_cols))
        return out
