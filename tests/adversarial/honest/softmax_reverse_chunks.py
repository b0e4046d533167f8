"""Honest: a legal reordering of the floating-point sum: the row's max and denominator are
accumulated chunk by chunk from the last chunk back to the first."""
# reference: softmax

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK = 256


@triton.jit
def reverse_softmax_kernel(out_ptr, in_ptr, n_cols, in_stride, out_stride, n_chunks,
                           BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = tl.full((), -float("inf"), tl.float32)
    for k in range(0, n_chunks):
        cols = (n_chunks - 1 - k) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(in_ptr + row * in_stride + cols, mask=cols < n_cols, other=-float("inf"))
        m = tl.maximum(m, tl.max(x, axis=0))
    s = tl.zeros((), tl.float32)
    for k in range(0, n_chunks):
        cols = (n_chunks - 1 - k) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(in_ptr + row * in_stride + cols, mask=cols < n_cols, other=-float("inf"))
        s += tl.sum(tl.exp(x - m), axis=0)
    for k in range(0, n_chunks):
        cols = k * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf"))
        tl.store(out_ptr + row * out_stride + cols, tl.exp(x - m) / s, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        out = torch.empty_like(x2)
        n_cols = x2.shape[1]
        reverse_softmax_kernel[(x2.shape[0],)](out, x2, n_cols, x2.stride(0), out.stride(0),
                                               triton.cdiv(n_cols, BLOCK), BLOCK=BLOCK)
        return out.reshape(x.shape)
