"""Triton LayerNorm: one program per row; mean and variance in fp32, two passes in registers."""

import torch
import torch.nn as nn
import triton
import triton.language as tl

TUNABLES = {"num_warps": [1, 2, 4, 8, 16]}
num_warps = 8


@triton.jit
def layernorm_kernel(out_ptr, in_ptr, w_ptr, b_ptr, n_cols, stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    var = tl.sum(d * d, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride + cols, d * rstd * w + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.ln = nn.LayerNorm(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty_like(x2)
        n_rows, n_cols = x2.shape
        layernorm_kernel[(n_rows,)](out, x2, self.ln.weight, self.ln.bias, n_cols, x2.stride(0),
                                    self.ln.eps, BLOCK=triton.next_power_of_2(n_cols),
                                    num_warps=num_warps)
        return out.reshape(x.shape)
