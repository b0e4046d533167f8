"""Shared arenas: memory two processes map at once, handed over as a file descriptor over the
sandbox socket (memfds on a CPU; the GPU path is the same code with CUDA VMM handles)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch

from kernelabd.harness import shared, wire
from tests.conftest import ROOT

CHILD = r"""
import socket, sys
sys.path.insert(0, sys.argv[2])
from kernelabd.harness import shared, wire
sock = socket.socket(fileno=int(sys.argv[1]))
fds = []
head, _ = wire.recv(sock, fds)
arena = shared.Arena.open("cpu", fds[0], head["nbytes"])
x = arena.tensor(shared.Slot.from_json(head["slot"], arena.nbytes))
x.mul_(2)
wire.send(sock, {"sum": float(x.sum())})
"""


def test_a_child_process_sees_and_writes_the_same_memory_through_the_descriptor():
    t = torch.arange(1000, dtype=torch.float32)
    arena, [slot] = shared.pack([t], "cpu")
    parent, child = socket.socketpair()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(child.fileno()), str(ROOT)],
                            pass_fds=(child.fileno(),))
    child.close()
    sent = arena.export()
    wire.send(parent, {"nbytes": arena.nbytes, "slot": slot.to_json()}, fds=[sent])
    os.close(sent)
    parent.settimeout(60)
    reply, _ = wire.recv(parent)
    assert proc.wait(30) == 0
    assert reply["sum"] == 2 * float(t.sum())                 # the child read the values
    assert torch.equal(arena.tensor(slot), t * 2)             # and its writes are ours to see
    arena.close()


def test_descriptors_a_message_brings_are_closed_unless_the_caller_takes_them():
    a, b = socket.socketpair()
    r, w = os.pipe()
    wire.send(a, {"x": 1}, fds=[r])
    before = len(os.listdir("/proc/self/fd"))
    header, _ = wire.recv(b)
    assert header["x"] == 1 and len(os.listdir("/proc/self/fd")) == before
    os.close(r)
    os.close(w)


def test_a_slot_outside_its_arena_or_misaligned_is_refused():
    arena = shared.Arena.allocate("cpu", 4096)
    with pytest.raises(shared.ArenaError):
        shared.Slot.from_json({"offset": 0, "dtype": "float32", "shape": [2048]}, arena.nbytes)
    with pytest.raises(shared.ArenaError):
        shared.Slot.from_json({"offset": 4, "dtype": "float32", "shape": [4]}, arena.nbytes)
    with pytest.raises(shared.ArenaError):
        shared.Slot.from_json({"offset": 0, "dtype": "complex64", "shape": [4]}, arena.nbytes)
    arena.close()


def test_an_arena_smaller_than_announced_is_refused():
    arena = shared.Arena.allocate("cpu", 4096)
    with pytest.raises(shared.ArenaError, match="smaller"):
        shared.Arena.open("cpu", arena.export(), 8192)
    arena.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_memory_is_shared_through_a_vmm_descriptor():
    t = torch.randn(1 << 20, device="cuda")
    arena, [slot] = shared.pack([t], "cuda:0")
    again = shared.Arena.open("cuda:0", arena.export(), arena.nbytes, writable=False)
    assert torch.equal(again.tensor(slot), t)
    again.close()
    arena.close()
