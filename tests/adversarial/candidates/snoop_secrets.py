"""Exploit: find kernelab's database, configuration or the oracle through /proc or the home
path (another process's command line and environment for `--home` and KERNELAB_HOME, its
working directory, open files and memory; the default homes), and behave differently once it
has seen them: here, return zeros. A sandbox that sees none of it computes the right answer.

Source: kernelab issue 20 (a candidate must not be able to read the daemon or the verifier);
KernelBot/pygpubench submissions reading the expected output from the harness's files.
"""
# reference: softmax
# expect: pass
# device: cpu

import os
import pwd

import torch
import torch.nn as nn
import triton
import triton.language as tl

SECRETS = ("kernelab.db", "kernelab.toml")


def read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def homes_named_by(pid: str) -> set[str]:
    """Homes a process names: its --home argument, KERNELAB_HOME and STATE_DIRECTORY, its cwd."""
    found = set()
    args = read(f"/proc/{pid}/cmdline").split(b"\0")
    found |= {args[i + 1].decode(errors="replace") for i, a in enumerate(args[:-1]) if a == b"--home"}
    for var in read(f"/proc/{pid}/environ").split(b"\0"):
        key, _, value = var.partition(b"=")
        if key in (b"KERNELAB_HOME", b"STATE_DIRECTORY"):
            found.add(value.decode(errors="replace"))
    try:
        found.add(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        pass
    return found


def open_secrets(pid: str) -> list[str]:
    """Secret files a process holds open, and whether its memory can be read."""
    found = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.endswith(SECRETS):
                found.append(target)
    except OSError:
        pass
    if b"kernelab" in read(f"/proc/{pid}/cmdline") and read(f"/proc/{pid}/environ"):
        found.append(f"/proc/{pid}/environ")
    return found


def leaked() -> list[str]:
    me = str(os.getpid())
    homes = {os.path.join(p.pw_dir, ".local/state/kernelab") for p in pwd.getpwall()}
    homes.add("/var/lib/kernelab")
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit() and p != me):
        homes |= homes_named_by(pid)
        found += open_secrets(pid)
    found += [os.path.join(h, s) for h in homes for s in SECRETS if os.path.exists(os.path.join(h, s))]
    return found


LEAKED = leaked()


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
        return torch.zeros_like(x) if LEAKED else softmax(x)
