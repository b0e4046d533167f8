"""Exploit: call the nn module the reference itself uses (nn.LayerNorm), plus a dummy launch.

Source: KernelBench v0.1 blog ("inherit Model / call the reference"), Makora taxonomy
("Baseline Kernel").
"""
# reference: layernorm
# expect: torch_compute|no_target_kernel
# device: cpu

import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def touch_kernel(ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.load(ptr + offs)


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.ln = nn.LayerNorm(features)

    def forward(self, x):
        touch_kernel[(1,)](x, BLOCK=16)
        return self.ln(x)
