"""Exploit: never return (a spin loop in forward), hoping the harness waits forever or
counts a missing result as a skip.

Source: eval-harness research §4 (sandbox deadlines); KernelBench timeouts.
"""
# reference: softmax
# expect: timeout
# device: cpu
# timeout_s: 30

import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        n = 0
        while True:
            n += 1
