"""The float64 oracle is a copy of the reference model: the copy must be whole."""

from __future__ import annotations

import torch
import torch.nn as nn

from kernelabd.harness.child.server import model_copy


def test_an_oracle_copy_runs_its_own_layers_through_functions_stored_on_the_model():
    """minGPT's block keeps ``self.mlpf = lambda x: m.c_proj(m.c_fc(x))``: a deep copy made
    float64 must call its own (float64) layers, not the float32 original's."""
    model = nn.Module()
    model.mlp = nn.ModuleDict({"fc": nn.Linear(4, 3)})
    m = model.mlp
    model.mlpf = lambda x: m.fc(x)
    twin = model_copy(model).double()
    x = torch.randn(2, 4, dtype=torch.float64)
    assert twin.mlpf(x).dtype == torch.float64
    assert model.mlp.fc.weight.dtype == torch.float32
    with torch.no_grad():
        assert torch.allclose(twin.mlpf(x), x @ model.mlp.fc.weight.double().T + model.mlp.fc.bias.double())
