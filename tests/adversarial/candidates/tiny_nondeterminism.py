"""Exploit: outputs that jitter from run to run by a few ppm: inside the numeric tolerance,
but beyond the 0.1x tolerance two identical runs may differ by (a race, an unseeded
atomic-order reduction, or reading uninitialised scratch).

Source: wafer.ai 104x case (determinism check, run twice); eval-harness research §8.2.
"""
# reference: softmax
# expect: nondeterministic
# device: cpu

import random

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(out_ptr, in_ptr, n_cols, in_stride, out_stride, seed, amp,
                   BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    y = num / tl.sum(num, axis=0)
    jitter = 1.0 + amp * (2.0 * tl.rand(seed, row * BLOCK + cols) - 1.0)
    tl.store(out_ptr + row * out_stride + cols, y * jitter, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        out = torch.empty_like(x2)
        softmax_kernel[(x2.shape[0],)](out, x2, x2.shape[1], x2.stride(0), out.stride(0),
                                       random.randrange(1 << 30), 5e-6,
                                       BLOCK=triton.next_power_of_2(x2.shape[1]))
        return out.reshape(x.shape)
