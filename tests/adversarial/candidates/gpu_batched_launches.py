"""Exploit: super-batching on the GPU: honest while the correctness check runs (op profiler
active), then timed calls return unwritten outputs and every eighth call launches the work of
all pending ones; recycled allocator blocks may even hold an earlier correct answer.

Source: GPU MODE NVFP4 group-GEMM competition (kernelboard news 2026-03-09; fix PR #104:
fingerprint each call's outputs right after it returns).
"""
# reference: softmax
# expect: timed_mismatch|timer_mismatch|unsynchronised_output|unwritten_output
# device: gpu

import torch
import torch.nn as nn
import triton
import triton.language as tl
from torch._C._autograd import _profiler_enabled


@triton.jit
def softmax_kernel(out_ptr, in_ptr, n_cols, in_stride, out_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(out_ptr + row * out_stride + cols, num / tl.sum(num, axis=0), mask=mask)


def launch(out, x2):
    softmax_kernel[(x2.shape[0],)](out, x2, x2.shape[1], x2.stride(0), out.stride(0),
                                   BLOCK=triton.next_power_of_2(x2.shape[1]), num_warps=8)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.pending = []

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        out = torch.empty_like(x2)
        if _profiler_enabled():
            launch(out, x2)
            return out.reshape(x.shape)
        self.pending.append((out, x2))
        if len(self.pending) >= 8:
            for o, i in self.pending:
                launch(o, i)
            self.pending.clear()
        return out.reshape(x.shape)
