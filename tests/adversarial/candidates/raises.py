"""Exploit: raise in forward (a harness that catches and ignores errors would skip the check).

Source: Makora taxonomy (try/except fallbacks); KernelBench compile/runtime-error handling.
"""
# reference: softmax
# expect: exception
# device: cpu

import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
