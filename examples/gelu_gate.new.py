"""Triton fusion of the chain: one pass over memory instead of four eager kernels."""

import torch
import torch.nn as nn
import triton
import triton.language as tl

TUNABLES = {"BLOCK_SIZE": [256, 512, 1024, 2048, 4096], "num_warps": [2, 4, 8]}
BLOCK_SIZE = 1024
num_warps = 4

@triton.jit
def gelu_gate_kernel(out_ptr, x_ptr, bias_ptr, n, dim, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    u = x + tl.load(bias_ptr + offs % dim, mask=mask, other=0.0)
    # 0.5 * (1 + tanh(z)) == sigmoid(2z)
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
        n = x.numel()
        grid = (triton.cdiv(n, BLOCK_SIZE),)
        gelu_gate_kernel[grid](out, x, self.bias, n, x.shape[-1], BLOCK_SIZE=BLOCK_SIZE,
                               num_warps=num_warps)
        return out
