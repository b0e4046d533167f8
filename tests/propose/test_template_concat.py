"""The concatenation template: ``torch.cat`` and ``torch.stack`` as a copy of each input into its
slice of the output, and the graphs built around one (an Inception module's branches, a DenseNet
block's growing feature list) as pipelines of templates; each passes the real gate on CPU
(Triton interpreter), and the copy compiles for sm_90 into 16-byte loads and stores."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kernelabd.propose.template.proposer import attempt, instantiate
from tests.propose.test_template import assert_ported, reference

INCEPTION = """\
self.b1 = nn.Conv2d(4, 3, 1)
self.b3 = nn.Sequential(nn.Conv2d(4, 2, 1), nn.Conv2d(2, 5, 3, padding=1))
self.bp = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), nn.Conv2d(4, 2, 1))
"""
DENSE = """\
self.layers = nn.ModuleList([nn.Sequential(nn.ReLU(), nn.Conv2d(3 + 2 * i, 2, 3, padding=1, bias=False))
                             for i in range(2)])
"""
DENSE_FORWARD = """\
features = [x]
    for layer in self.layers:
        features.append(layer(x))
        x = torch.cat(features, 1)
    return x"""

# name -> (init, forward body, inputs, the edit, forward's parameters)
CONCATS = {
    "inception_branches": (INCEPTION, "return torch.cat([self.b1(x), self.b3(x), self.bp(x)], 1)",
                           "torch.randn(2, 4, 7, 6)", "concatenation of 3 along dim 1", "x"),
    "dense_block_growing_list": (DENSE, DENSE_FORWARD, "torch.randn(2, 3, 6, 5)", "concatenation of 3 along dim 1",
                                 "x"),
    "odd_widths_last_dim_then_scaled": ("", "return torch.concat((x, y), dim=-1) * 2.0",
                                        "torch.randn(3, 5, 7), torch.randn(3, 5, 2)",
                                        "concatenation of 2 along dim 2", "x, y"),
    "stack_of_branches_then_sum": ("self.a = nn.Conv1d(3, 4, 3)\nself.b = nn.Conv1d(3, 4, 3)\n",
                                   "return torch.stack([torch.relu(self.a(x)), torch.sigmoid(self.b(x))], "
                                   "dim=-1).sum(-1)",
                                   "torch.randn(2, 3, 9)", "stack of 2 along dim 3", "x"),
    "cat_of_inputs_along_dim_0": ("", "return torch.cat([x, y, x], 0)", "torch.randn(2, 3, 5), torch.randn(1, 3, 5)",
                                  "concatenation of 3 along dim 0", "x, y"),
}


@pytest.mark.parametrize("name", sorted(CONCATS))
def test_concatenation_passes_the_gate(tmp_path, name):
    init, forward, inputs, edit, params = CONCATS[name]
    assert_ported(tmp_path, name, init, forward, inputs, edit, params)


def test_inputs_of_different_ranks_or_a_dim_out_of_range_match_nothing():
    for forward, inputs in (("torch.cat([x, y], 1)", "torch.randn(2, 3), torch.randn(2, 3, 1)"),
                            ("torch.cat([x, y], 2)", "torch.randn(2, 3), torch.randn(2, 3)")):
        source = reference(f"def forward(self, x, y):\n    return {forward}\n", inputs=inputs)
        assert not hasattr(attempt(source), "source"), forward


CAT_SIZED = """\
import torch
import torch.nn as nn

N = 2


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return torch.cat([x, y], 1) + 1.0


def get_inputs():
    return [torch.randn(N, 16, 8, 8), torch.randn(N, 48, 8, 8)]


def get_init_inputs():
    return []
"""


def test_a_channel_concatenation_of_images_copies_in_16_byte_vectors_on_sm90(tmp_path):
    """Compiled for sm_90 without a GPU: an image's channels are whole rows of 16-divisible
    columns, so every load and store of the copy is 16 bytes wide and nothing spills."""
    ref, cand = tmp_path / "cat.py", tmp_path / "cat.new.py"
    ref.write_text(CAT_SIZED)
    found = instantiate(CAT_SIZED)
    assert found is not None and "concatenation of 2 along dim 1" in found.edit, found
    cand.write_text(found.source)
    run = subprocess.run([sys.executable, "-m", "kernelabd", "fingerprint", str(cand), "--arch", "sm_90", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    copies = [k for k in json.loads(run.stdout)["kernels"] if "cat_copy" in k["name"]]
    assert copies
    for kernel in copies:
        ops = kernel["instructions"]
        assert kernel["spills"] == 0
        moves = {name for name in ops if name.startswith(("LDG", "STG"))}
        assert moves == {"LDG.128", "STG.128"}, ops
