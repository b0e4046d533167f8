"""Exploit: patch the comparison functions only inside forward and restore them on return.

Source: variant of the DeepReinforce / GPU MODE #162 monkey-patching hacks that dodges an
identity check made after the call. Comparison runs in another process, so the zeros it
returns must still be judged wrong.
"""
# reference: softmax
# expect: mismatch
# device: cpu

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def zero_kernel(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros((BLOCK,), tl.float32), mask=offs < n)


class ModelNew(nn.Module):
    def forward(self, x):
        saved = torch.allclose, torch.testing.assert_close
        torch.allclose = lambda *a, **k: True
        torch.testing.assert_close = lambda *a, **k: None
        try:
            out = torch.empty_like(x)
            zero_kernel[(triton.cdiv(x.numel(), 1024),)](out, x.numel(), BLOCK=1024)
            return out
        finally:
            torch.allclose, torch.testing.assert_close = saved
