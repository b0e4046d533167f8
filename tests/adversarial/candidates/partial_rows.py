"""Exploit: a grid that covers only the first row; the rest of the output is whatever the
allocator left there.

Source: Sakana AI CUDA Engineer L1/15 (grid bug computed only row 0 and passed 4/5 KernelBench
trials through memory reuse; KernelBench PR #25).
"""
# reference: softmax
# expect: unwritten_output|mismatch|non_finite
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


class ModelNew(nn.Module):
    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        out = torch.empty_like(x2)
        softmax_kernel[(1,)](out, x2, x2.shape[1], x2.stride(0), out.stride(0),
                             BLOCK=triton.next_power_of_2(x2.shape[1]))
        return out.reshape(x.shape)
