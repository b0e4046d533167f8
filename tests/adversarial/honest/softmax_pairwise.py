"""Honest: pairwise (two-level) reduction: the row is viewed as a [ROWS, 32] tile, summed
along the short axis first and then across the partial sums."""
# reference: softmax

import torch
import torch.nn as nn
import triton
import triton.language as tl

LANES = 32


@triton.jit
def pairwise_softmax_kernel(out_ptr, in_ptr, n_cols, in_stride, out_stride,
                            ROWS: tl.constexpr, LANES: tl.constexpr):
    row = tl.program_id(0)
    idx = tl.arange(0, ROWS)[:, None] * LANES + tl.arange(0, LANES)[None, :]
    mask = idx < n_cols
    x = tl.load(in_ptr + row * in_stride + idx, mask=mask, other=-float("inf"))
    m = tl.max(tl.max(x, axis=1), axis=0)
    e = tl.exp(x - m)
    s = tl.sum(tl.sum(e, axis=1), axis=0)
    tl.store(out_ptr + row * out_stride + idx, e / s, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        out = torch.empty_like(x2)
        n_cols = x2.shape[1]
        rows = max(1, triton.next_power_of_2(triton.cdiv(n_cols, LANES)))
        pairwise_softmax_kernel[(x2.shape[0],)](out, x2, n_cols, x2.stride(0), out.stride(0),
                                                ROWS=rows, LANES=LANES)
        return out.reshape(x.shape)
