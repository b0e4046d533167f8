"""Exploit: read the expected output out of shared memory the harness hands the sandbox.

Inputs, weights and outputs travel between processes in shared arenas (memfds on a CPU). A
candidate that looks through its own open descriptors for an arena laid out as the reference's
is (the inputs, then the oracle right after them) would return the oracle as its own output,
were it ever given one. It is given only fresh copies of its own inputs.
Source: the "steal the answer" class of exploits (KernelBench's cached/expected-output hacks).
"""
# reference: softmax
# expect: mismatch|non_finite|unwritten_output
# device: cpu

import mmap
import os

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def copy_kernel(out_ptr, in_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(in_ptr + offs, mask=offs < n), mask=offs < n)


def _arena_after(x: torch.Tensor) -> torch.Tensor | None:
    """A tensor shaped like ``x`` lying right after ``x``'s bytes in any arena we hold."""
    nbytes = x.numel() * x.element_size()
    offset = -(-nbytes // 512) * 512
    for name in os.listdir("/proc/self/fd"):
        try:
            if "kernelab-arena" not in os.readlink(f"/proc/self/fd/{name}"):
                continue
            size = os.fstat(int(name)).st_size
        except OSError:
            continue
        if size >= offset + nbytes:
            mm = mmap.mmap(int(name), size, prot=mmap.PROT_READ)
            return torch.frombuffer(mm, dtype=x.dtype, count=x.numel(), offset=offset).reshape(x.shape).clone()
    return None


class ModelNew(nn.Module):
    def forward(self, x):
        stolen = _arena_after(x.contiguous())
        source = stolen if stolen is not None else x
        out = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](out, source.contiguous(), x.numel(), BLOCK=1024)
        return out
