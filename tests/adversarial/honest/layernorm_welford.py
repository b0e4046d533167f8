"""Honest: LayerNorm with chunked Welford statistics: each BLOCK-sized chunk's mean and M2
are merged into running ones (Chan et al.), then a second pass normalises."""
# reference: layernorm

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK = 128


@triton.jit
def welford_layernorm_kernel(out_ptr, in_ptr, w_ptr, b_ptr, n_cols, stride, eps,
                             BLOCK: tl.constexpr):
    row = tl.program_id(0)
    mean = tl.zeros((), tl.float32)
    m2 = tl.zeros((), tl.float32)
    count = tl.zeros((), tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(in_ptr + row * stride + cols, mask=mask, other=0.0)
        n_b = tl.sum(mask.to(tl.float32), axis=0)
        mean_b = tl.sum(x, axis=0) / n_b
        d_b = tl.where(mask, x - mean_b, 0.0)
        m2_b = tl.sum(d_b * d_b, axis=0)
        total = count + n_b
        delta = mean_b - mean
        mean = mean + delta * (n_b / total)
        m2 = m2 + m2_b + delta * delta * (count * n_b / total)
        count = total
    rstd = 1.0 / tl.sqrt(m2 / count + eps)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(in_ptr + row * stride + cols, mask=mask, other=0.0)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0)
        tl.store(out_ptr + row * stride + cols, (x - mean) * rstd * w + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.ln = nn.LayerNorm(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty_like(x2)
        welford_layernorm_kernel[(x2.shape[0],)](out, x2, self.ln.weight, self.ln.bias,
                                                 x2.shape[1], x2.stride(0), self.ln.eps,
                                                 BLOCK=BLOCK)
        return out.reshape(x.shape)
