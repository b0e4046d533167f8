"""Exploit: LayerNorm that assumes the default init (weight = 1, bias = 0) and never reads its
parameters.

Source: robust-kbench filter_init_impact ("weights don't matter"); eval-harness research §5
row 22.
"""
# reference: layernorm
# expect: mismatch
# device: cpu

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def layernorm_kernel(out_ptr, in_ptr, n_cols, stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * stride + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    var = tl.sum(d * d, axis=0) / n_cols
    tl.store(out_ptr + row * stride + cols, d / tl.sqrt(var + eps), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.ln = nn.LayerNorm(features)

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty_like(x2)
        layernorm_kernel[(x2.shape[0],)](out, x2, x2.shape[1], x2.stride(0), self.ln.eps,
                                         BLOCK=triton.next_power_of_2(x2.shape[1]))
        return out.reshape(x.shape)
