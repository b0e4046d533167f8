"""Exploit: honest for the first calls (the correctness check), then returns garbage fast
once the call count says it is being timed.

Source: pygpubench submission_warmup.py; GPU MODE NVFP4 super-batch (counted calls).
"""
# reference: softmax
# expect: timed_mismatch
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
    tl.store(out_ptr + row * out_stride + cols, num / tl.sum(num, axis=0), mask=mask)


@triton.jit
def fill_kernel(out_ptr, n, value, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros((BLOCK,), tl.float32) + value, mask=offs < n)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        x2 = x.reshape(-1, x.shape[-1])
        out = torch.empty_like(x2)
        if self.calls <= 10:
            softmax_kernel[(x2.shape[0],)](out, x2, x2.shape[1], x2.stride(0), out.stride(0),
                                           BLOCK=triton.next_power_of_2(x2.shape[1]))
        else:   # "uniform" rows: right sum, wrong values, a tiny fraction of the work
            fill_kernel[(triton.cdiv(out.numel(), 4096),)](out, out.numel(), 1.0 / x2.shape[1],
                                                           BLOCK=4096)
        return out.reshape(x.shape)
