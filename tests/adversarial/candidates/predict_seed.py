"""Exploit: predict the input seed: regenerate get_inputs() under the usual seeds at init and
return the matching precomputed answer (falling back to its best guess).

Source: KernelBot cheat-rng.py; eval-harness research §5 row 15 (defence: secret seeds).
"""
# reference: softmax
# expect: mismatch
# device: cpu

import torch
import torch.nn as nn
import triton
import triton.language as tl

GUESSED_SEEDS = [0, 1, 42, 1234, 2024, 2025, 3407, 12345]


@triton.jit
def copy_kernel(out_ptr, src_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = []
        for seed in GUESSED_SEEDS:
            for shape in ((16, 1000), (7, 1023), (8192, 8192)):
                if shape[0] * shape[1] > 1 << 20:
                    continue
                torch.manual_seed(seed)
                x = torch.randn(*shape)
                self.table.append((x[0, 0].item(), x[0, 1].item(), torch.softmax(x, dim=-1)))

    def forward(self, x):
        first, second = x.reshape(-1)[0].item(), x.reshape(-1)[1].item()
        guess = next((y for a, b, y in self.table if (a, b) == (first, second)), None)
        if guess is None or guess.shape != x.shape:
            guess = next((y for _, _, y in self.table if y.shape == x.shape), self.table[0][2])
        out = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](out, guess.to(x.device), min(
            x.numel(), guess.numel()), BLOCK=1024)
        return out
