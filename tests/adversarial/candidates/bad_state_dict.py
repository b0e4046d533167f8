"""Exploit: parameters under other names, so the reference's (re-randomised) state_dict cannot
be loaded and the candidate keeps its own default init.

Source: robust-kbench filter_init_impact; KernelBench candidates that rename or drop
parameters.
"""
# reference: layernorm
# expect: state_dict
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
    d = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride + cols, d * rstd * w + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(features))
        self.beta = nn.Parameter(torch.zeros(features))

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty_like(x2)
        layernorm_kernel[(x2.shape[0],)](out, x2, self.gamma, self.beta, x2.shape[1],
                                         x2.stride(0), 1e-5,
                                         BLOCK=triton.next_power_of_2(x2.shape[1]))
        return out.reshape(x.shape)
