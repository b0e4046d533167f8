"""Exploit: a NaN in the output (NaN compares as "don't care" in some checkers).

Source: pygpubench exploits/submission_gc_nan.py; eval-harness research §5 row 12 ("NaN in
expected must not be a wildcard").
"""
# reference: softmax
# expect: non_finite
# device: cpu

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(out_ptr, in_ptr, n_cols, in_stride, out_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    y = num / tl.sum(num, axis=0)
    y = tl.where(cols == 3, float("nan"), y)
    tl.store(out_ptr + row * out_stride + cols, y, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        out = torch.empty_like(x2)
        softmax_kernel[(x2.shape[0],)](out, x2, x2.shape[1], x2.stride(0), out.stride(0),
                                       BLOCK=triton.next_power_of_2(x2.shape[1]))
        return out.reshape(x.shape)
