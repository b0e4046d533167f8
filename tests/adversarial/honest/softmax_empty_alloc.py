"""Honest: output allocated with torch.empty(shape, dtype, device) in its final shape rather
than empty_like of a reshaped view; exp computed as exp2(x * log2(e))."""
# reference: softmax

import torch
import torch.nn as nn
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def softmax_exp2_kernel(out_ptr, in_ptr, n_cols, in_stride, out_stride, log2e,
                        BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf"))
    e = tl.exp2((x - tl.max(x, axis=0)) * log2e)
    tl.store(out_ptr + row * out_stride + cols, e / tl.sum(e, axis=0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        n_cols = x.shape[-1]
        n_rows = x.numel() // n_cols
        softmax_exp2_kernel[(n_rows,)](out, x, n_cols, n_cols, n_cols, LOG2E,
                                       BLOCK=triton.next_power_of_2(n_cols))
        return out
