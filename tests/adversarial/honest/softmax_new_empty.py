"""Honest: output from x.new_empty, reciprocal of the denominator multiplied in, and a grid
that loops over rows (a fixed number of programs, each striding through the rows)."""
# reference: softmax

import torch
import torch.nn as nn
import triton
import triton.language as tl

PROGRAMS = 4


@triton.jit
def strided_softmax_kernel(out_ptr, in_ptr, n_rows, n_cols, in_stride, out_stride,
                           PROGRAMS: tl.constexpr, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    for row in range(tl.program_id(0), n_rows, PROGRAMS):
        x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf"))
        e = tl.exp(x - tl.max(x, axis=0))
        inv = 1.0 / tl.sum(e, axis=0)
        tl.store(out_ptr + row * out_stride + cols, e * inv, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        out = x2.new_empty(x2.shape)
        n_rows, n_cols = x2.shape
        strided_softmax_kernel[(PROGRAMS,)](out, x2, n_rows, n_cols, x2.stride(0),
                                            out.stride(0), PROGRAMS=PROGRAMS,
                                            BLOCK=triton.next_power_of_2(n_cols))
        return out.reshape(x.shape)
