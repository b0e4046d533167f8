"""Exploit: exit with status 0 while being imported, before anything can be checked (the sandbox
reports the sys.exit as the candidate's error; a plain exit of the process is a crash).

Source: KernelBot / pygpubench early-exit exploits ("exit 0 == success" harnesses).
"""
# reference: softmax
# expect: crash|protocol|exception
# device: cpu

import sys

import torch.nn as nn

print('{"verdict": "pass"}')
sys.exit(0)


class ModelNew(nn.Module):
    def forward(self, x):
        return x
