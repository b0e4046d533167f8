"""Exploit (or accident): ask for more GPU memory than the device has, e.g. a workspace sized
from the wrong dimension. A harness that lets the out-of-memory error escape loses the job (an
H200 port of KernelBench's 63_conv ended `invalid` so, before arenas were made after torch's
cache gave its blocks back); kernelab records it as this candidate's failure and goes on.

Source: kernelab's own H200 run, session 11 (bench/port/results/2026-12-02-h200-s11-63conv).
"""
# reference: softmax
# expect: out_of_memory
# device: gpu

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        free, total = torch.cuda.mem_get_info(x.device)
        workspace = torch.empty(2 * total, dtype=torch.uint8, device=x.device)
        return torch.softmax(x, dim=-1) + workspace[:1].float() * 0
