"""Exploit: exit with status 0 while being imported, before anything can be checked.

Source: KernelBot / pygpubench early-exit exploits ("exit 0 == success" harnesses).
"""
# reference: softmax
# expect: crash|protocol
# device: cpu

import sys

import torch.nn as nn

print('{"verdict": "pass"}')
sys.exit(0)


class ModelNew(nn.Module):
    def forward(self, x):
        return x
