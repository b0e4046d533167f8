"""Honest: the gelu-gate chain with one program per row (no modulo for the bias index) and
the output allocated with torch.empty in the input's shape."""
# reference: gelu_gate

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def gelu_gate_row_kernel(out_ptr, x_ptr, bias_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    u = x + tl.load(bias_ptr + cols, mask=mask, other=0.0)
    z = 0.7978845608028654 * (u + 0.044715 * u * u * u)
    gelu = u * tl.sigmoid(2.0 * z)
    tl.store(out_ptr + row * n_cols + cols, gelu * tl.sigmoid(x), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        n_cols = x.shape[-1]
        gelu_gate_row_kernel[(x.numel() // n_cols,)](out, x, self.bias, n_cols,
                                                     BLOCK=triton.next_power_of_2(n_cols))
        return out
