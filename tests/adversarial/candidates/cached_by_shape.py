"""Exploit: memoise the output by input shape and return it on every later call.

Source: CUDA-L1 (cache keyed on stable input addresses); GPU MODE reference-kernels issue #162
("in-process cache / file replay"). Computes honestly once per shape, then replays.
"""
# reference: softmax
# expect: no_target_kernel|mismatch
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
    def __init__(self):
        super().__init__()
        self.cache = {}

    def forward(self, x):
        key = tuple(x.shape)
        if key not in self.cache:
            x2 = x.reshape(-1, x.shape[-1])
            out = torch.empty_like(x2)
            softmax_kernel[(x2.shape[0],)](out, x2, x2.shape[1], x2.stride(0), out.stride(0),
                                           BLOCK=triton.next_power_of_2(x2.shape[1]))
            self.cache[key] = out.reshape(x.shape)
        return self.cache[key].clone()
