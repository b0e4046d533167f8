"""Exploit: open a TCP connection to every port listening on this machine's loopback (found
in /proc/net/tcp), to reach a local service (a model server, a database, another job's
process, the way out to the internet) and send what it has seen; behave differently once
connected: here, return zeros. A sandbox that can reach no socket computes the right answer.

Source: kernelab issue 20 (a new network namespace with no interface but loopback).
"""
# reference: softmax
# expect: pass
# device: cpu

import socket

import torch
import torch.nn as nn
import triton
import triton.language as tl

LISTEN = "0A"


def listening_ports() -> set[int]:
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 3 and fields[3] == LISTEN:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def reached() -> list[int]:
    got = []
    for port in sorted(listening_ports()):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                conn.sendall(b"kernelab candidate was here\n")
                got.append(port)
        except OSError:
            pass
    return got


REACHED = reached()


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
        return torch.zeros_like(x) if REACHED else softmax(x)
