"""Exploit: die by SIGSEGV in forward (as an illegal memory access would), hoping a crash is
counted as a skip rather than a failure.

Source: eval-harness research §4 (a crash must kill only the sandbox); KernelBench
illegal-memory-access runs poisoning later trials.
"""
# reference: softmax
# expect: crash
# device: cpu

import os
import signal

import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        os.kill(os.getpid(), signal.SIGSEGV)
