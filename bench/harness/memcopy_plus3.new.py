"""Triton copy: the honest kernel of the sensitivity benchmark."""

import torch
import torch.nn as nn
import triton
import triton.language as tl

EXTRA = 0.03         # moves 3 % more bytes than memcopy.new.py
BLOCK = 4096


@triton.jit
def copy_kernel(out_ptr, in_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(in_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.scratch = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        copy_kernel[(triton.cdiv(n, BLOCK),)](out, x, n, BLOCK=BLOCK, num_warps=8)
        extra = int(n * EXTRA)
        if extra:
            if self.scratch is None or self.scratch.numel() != 2 * extra:
                self.scratch = torch.empty(2 * extra, device=x.device, dtype=x.dtype)
            src, dst = self.scratch[:extra], self.scratch[extra:]
            copy_kernel[(triton.cdiv(extra, BLOCK),)](dst, src, extra, BLOCK=BLOCK, num_warps=8)
        return out
