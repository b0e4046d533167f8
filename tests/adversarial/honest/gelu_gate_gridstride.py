"""Honest: the gelu-gate chain with a fixed grid of PROGRAMS programs striding over the
flattened tensor (a persistent-kernel layout)."""
# reference: gelu_gate

import torch
import torch.nn as nn
import triton
import triton.language as tl

PROGRAMS = 8
BLOCK_SIZE = 512


@triton.jit
def gelu_gate_persistent_kernel(out_ptr, x_ptr, bias_ptr, n, dim, PROGRAMS: tl.constexpr,
                                BLOCK_SIZE: tl.constexpr):
    for start in range(tl.program_id(0) * BLOCK_SIZE, n, PROGRAMS * BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        u = x + tl.load(bias_ptr + offs % dim, mask=mask, other=0.0)
        z = 0.7978845608028654 * (u + 0.044715 * u * u * u)
        gelu = u / (1.0 + tl.exp(-2.0 * z))
        tl.store(out_ptr + offs, gelu / (1.0 + tl.exp(-x)), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        gelu_gate_persistent_kernel[(PROGRAMS,)](out, x, self.bias, x.numel(), x.shape[-1],
                                                 PROGRAMS=PROGRAMS, BLOCK_SIZE=BLOCK_SIZE)
        return out
