"""Honest: LayerNorm in three chunked passes (sum for the mean, sum of squared deviations for
the variance, then normalise), with the reciprocal std from rsqrt."""
# reference: layernorm

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK = 256


@triton.jit
def chunked_layernorm_kernel(out_ptr, in_ptr, w_ptr, b_ptr, n_cols, stride, eps,
                             BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(in_ptr + row * stride + cols, mask=cols < n_cols, other=0.0)
    mean = tl.sum(acc, axis=0) / n_cols
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        d = tl.where(mask, tl.load(in_ptr + row * stride + cols, mask=mask, other=0.0) - mean,
                     0.0)
        acc += d * d
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
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
        out = torch.empty(x2.shape, dtype=x2.dtype, device=x2.device)
        chunked_layernorm_kernel[(x2.shape[0],)](out, x2, self.ln.weight, self.ln.bias,
                                                 x2.shape[1], x2.stride(0), self.ln.eps,
                                                 BLOCK=BLOCK)
        return out.reshape(x.shape)
