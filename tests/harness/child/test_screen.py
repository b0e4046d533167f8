"""A screened variant's model: the reference's weights copied in, its initialisers not run."""

from __future__ import annotations

import math
import os
import types

import pytest
import torch

from kernelabd.harness import gate
from kernelabd.harness.child import screen
from kernelabd.harness.child.screen import build

CANDIDATE = '''
import torch, torch.nn as nn
INITIALISED = []
class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)
        self.register_buffer("scale", torch.ones(n))
        INITIALISED.append(self.lin.weight.device.type)
'''


def module_of(source: str) -> types.ModuleType:
    module = types.ModuleType("candidate")
    exec(source, module.__dict__)
    return module


def test_weights_are_copies_of_the_references_and_nothing_is_initialised_on_the_host():
    module = module_of(CANDIDATE)
    state = {"lin.weight": torch.randn(8, 8), "lin.bias": torch.randn(8), "scale": torch.full((8,), 3.0)}
    model = build(module, [8], state)
    assert module.INITIALISED == ["meta"], "constructed on the meta device only"
    assert torch.equal(model.lin.weight, state["lin.weight"]) and torch.equal(model.scale, state["scale"])
    model.lin.weight.data.zero_()
    assert state["lin.weight"].abs().sum() > 0, "a variant writing its weights leaves the next one's alone"


def test_state_the_weights_do_not_cover_is_built_as_written():
    module = module_of(CANDIDATE.replace('self.register_buffer("scale", torch.ones(n))',
                                         'self.register_buffer("cache", torch.arange(n), persistent=False)'))
    model = build(module, [8], {"lin.weight": torch.randn(8, 8), "lin.bias": torch.randn(8)})
    assert module.INITIALISED == ["meta", "cpu"] and torch.equal(model.cache, torch.arange(8))


def test_compile_processes_are_as_many_as_asked_while_half_the_hosts_memory_holds_them(monkeypatch):
    GiB = 1 << 30
    monkeypatch.setattr(screen, "host_available_bytes", lambda: 128 * GiB)
    assert screen.compile_workers(16, 10 << 20) == 16, "small problems use every core"
    assert screen.compile_workers(16, 7 * GiB) == 7, "64 GiB hold seven copies of 7 GiB inputs with their interpreters"
    assert screen.compile_workers(16, 200 * GiB) == 1, "one process compiles, however large the problem"
    monkeypatch.setattr(screen, "host_available_bytes", lambda: None)
    assert screen.compile_workers(4, 7 * GiB) == 4, "unknown free memory leaves the asked count"


def test_the_available_memory_is_read_from_this_host():
    available = screen.host_available_bytes()
    assert available is not None and 0 < available <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def screen_expecting(expected: list[torch.Tensor], device: str = "cpu") -> screen.Screen:
    box = screen.Screen()
    box.device, box.expected = device, expected
    return box


def test_the_sanity_check_is_the_normwise_error_a_chunk_at_a_time(monkeypatch):
    monkeypatch.setattr(gate, "CHUNK", 1000)      # 37 chunks and a partial one
    want = torch.randn(37, 1013)
    near, far = want * (1 + 0.01 * torch.randn_like(want)), want + 0.2 * want.norm() / math.sqrt(want.numel())
    whole = float((near.double() - want.double()).norm() / want.double().norm())
    assert gate.normwise_error(near, want) == pytest.approx(whole, rel=1e-9)
    box = screen_expecting([want])
    assert box.sanity([near]) is None, "1 % noise is an honest kernel's rounding and more"
    assert "normwise error" in box.sanity([far])
    broken = near.clone()
    broken[36, 1012] = float("nan")               # in the last, partial chunk
    assert box.sanity([broken]) == "output 0 is not finite"
    assert "has shape" in box.sanity([near[:, :-1]])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_sanity_check_of_a_large_output_holds_no_float64_copy_of_it():
    want = torch.randn(1 << 28, device="cuda")     # 1 GiB of fp32: a float64 copy is 2 GiB
    got = want * 1.001
    box = screen_expecting([want], "cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    assert box.sanity([got]) is None
    assert torch.cuda.max_memory_allocated() - before < 4 * gate.CHUNK * 8
