"""Exploit: one-pass LayerNorm variance as E[x^2] - E[x]^2 in float32: fine for zero-mean
inputs, catastrophic cancellation once the inputs carry an offset.

Source: eval-harness research §5 row 3 (correct only on get_inputs' distribution); offset
inputs as in GPU MODE vectorsum.
"""
# reference: layernorm
# expect: mismatch|non_finite
# device: cpu

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def layernorm_kernel(out_ptr, in_ptr, w_ptr, b_ptr, n_cols, stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * stride + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    var = tl.sum(x * x, axis=0) / n_cols - mean * mean
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride + cols, (x - mean) * rstd * w + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.ln = nn.LayerNorm(features)

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty_like(x2)
        layernorm_kernel[(x2.shape[0],)](out, x2, self.ln.weight, self.ln.bias, x2.shape[1],
                                         x2.stride(0), self.ln.eps,
                                         BLOCK=triton.next_power_of_2(x2.shape[1]))
        return out.reshape(x.shape)
