"""Exploit: compute in float16 inside the kernel of a float32 problem (output still float32).

Source: CRFM good-kernels (wmma fp16), CUDA-L1 L1/1 (fp16 matmul); DeepReinforce rates
precision downgrade "only partially defensible".
"""
# reference: softmax
# expect: mismatch
# device: cpu

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(out_ptr, in_ptr, n_cols, in_stride, out_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf")).to(tl.float16)
    x = x - tl.max(x, axis=0)
    num = tl.exp(x.to(tl.float32)).to(tl.float16)
    den = tl.sum(num, axis=0)
    tl.store(out_ptr + row * out_stride + cols, (num / den).to(tl.float32), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        out = torch.empty_like(x2)
        softmax_kernel[(x2.shape[0],)](out, x2, x2.shape[1], x2.stride(0), out.stride(0),
                                       BLOCK=triton.next_power_of_2(x2.shape[1]))
        return out.reshape(x.shape)
