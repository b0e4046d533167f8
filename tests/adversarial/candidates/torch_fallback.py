"""Exploit: no kernel at all, just the PyTorch op the reference uses.

Source: KernelBench v0.1 blog and Makora's taxonomy ("Baseline Kernel"); KernelBench
static-checker rules. A candidate that only calls PyTorch is not a port.
"""
# reference: softmax
# expect: no_target_kernel|torch_compute
# device: cpu

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=-1)
