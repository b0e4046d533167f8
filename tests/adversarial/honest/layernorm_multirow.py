"""Honest: LayerNorm on 2-D tiles of R rows per program, statistics reduced along axis 1,
affine parameters loaded once per tile."""
# reference: layernorm

import torch
import torch.nn as nn
import triton
import triton.language as tl

R = 2


@triton.jit
def multirow_layernorm_kernel(out_ptr, in_ptr, w_ptr, b_ptr, n_rows, n_cols, stride, eps,
                              R: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * R + tl.arange(0, R)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None] * stride + cols[None, :]
    x = tl.load(in_ptr + offs, mask=mask, other=0.0)
    mean = tl.sum(x, axis=1) / n_cols
    d = tl.where(mask, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=1) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0)
    b = tl.load(b_ptr + cols, mask=cols < n_cols, other=0.0)
    tl.store(out_ptr + offs, d * rstd[:, None] * w[None, :] + b[None, :], mask=mask)


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.ln = nn.LayerNorm(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty_like(x2)
        n_rows, n_cols = x2.shape
        multirow_layernorm_kernel[(triton.cdiv(n_rows, R),)](
            out, x2, self.ln.weight, self.ln.bias, n_rows, n_cols, x2.stride(0), self.ln.eps,
            R=R, BLOCK=triton.next_power_of_2(n_cols))
        return out.reshape(x.shape)
