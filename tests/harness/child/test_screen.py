"""A screened variant's model: the reference's weights copied in, its initialisers not run."""

from __future__ import annotations

import types

import torch

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
