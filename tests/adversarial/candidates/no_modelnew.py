"""Exploit: a candidate file without ModelNew (e.g. defines Model, hoping the reference's own
class is picked up instead).

Source: KernelBench v0.1 blog ("inherit Model"); a malformed submission must be an input
error (exit 2), never a pass.
"""
# reference: softmax
# expect: bad_candidate
# device: cpu

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)
