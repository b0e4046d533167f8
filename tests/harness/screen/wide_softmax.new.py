"""The whole row in one program's registers. ``SCALE = 2`` is a broken configuration (every
output doubled), which screening's sanity check catches before timing it."""

import torch
import torch.nn as nn
import triton
import triton.language as tl

TUNABLES = {"num_warps": [1, 4, 8], "SCALE": [1, 2]}
num_warps = 4
SCALE = 1


@triton.jit
def softmax_kernel(out_ptr, in_ptr, n_cols, BLOCK: tl.constexpr, SCALE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(out_ptr + row * n_cols + cols, SCALE * num / tl.sum(num, axis=0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        softmax_kernel[(x.shape[0],)](out, x, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]),
                                      SCALE=SCALE, num_warps=num_warps)
        return out
