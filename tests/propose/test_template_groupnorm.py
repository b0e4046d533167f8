"""The GroupNorm template (module and ``F.`` forms, with and without the affine map), alone and
as a pipeline's stage after a transposed convolution or a matmul, and on a group spanning
several steps far from zero (its one-read statistics), a channel's plane at a time; each passes
the real gate on CPU (Triton interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kernelabd.propose.template.proposer import instantiate
from tests.gating import assert_passes, gate
from tests.propose.test_template import assert_ported

# name -> (init, forward, inputs): GroupNorm, alone and where KernelBench level 2 puts it (after a
# convolution or a matmul, before an elementwise tail)
GROUP_NORMS = {
    "module_affine": ("self.gn = nn.GroupNorm(2, 6)\n", "return self.gn(x)", "torch.randn(3, 6, 5, 7)"),
    "functional_no_affine": ("", "return F.group_norm(x, 3, eps=1e-3)", "torch.randn(2, 6, 9)"),
    "conv_gelu_groupnorm": ("self.conv = nn.ConvTranspose2d(3, 8, 3, stride=2)\nself.gn = nn.GroupNorm(4, 8)\n",
                            "return self.gn(F.gelu(self.conv(x)))", "torch.randn(2, 3, 5, 6)"),
    # a group of 3200 values (a whole 2048-wide step and a partial one) whose mean is 10⁴ times
    # its spread: E[x²] − E[x]² in fp32 would lose every digit of the variance
    "far_from_zero_over_steps": ("self.gn = nn.GroupNorm(2, 4)\n", "return self.gn(x)",
                                 "torch.randn(2, 4, 40, 40) * 0.01 + 100.0"),
    "linear_groupnorm_hardtanh": ("self.fc = nn.Linear(10, 16)\nself.gn = nn.GroupNorm(4, 16)\n",
                                  "return F.hardtanh(self.gn(self.fc(x)), -2.0, 2.0)", "torch.randn(8, 10)"),
}


@pytest.mark.parametrize("name", sorted(GROUP_NORMS))
def test_group_norm_passes_the_gate(tmp_path, name):
    assert_ported(tmp_path, name, *GROUP_NORMS[name], "GroupNorm (a program a group")


GROUP_NORM_PLANES = """\
import torch
import torch.nn as nn

N, C, H, W = 2, 8, 40, 45


class Model(nn.Module):
    def __init__(self):
        super(Model, self).__init__()
        self.gn = nn.GroupNorm(4, C)
        nn.init.normal_(self.gn.weight)
        nn.init.normal_(self.gn.bias)

    def forward(self, x):
        return self.gn(x)


def get_inputs():
    return [torch.randn(N, C, H, W) * 0.01 + 100.0]


def get_init_inputs():
    return []
"""
"""Planes of 1800 values (one 2048-wide step, 12 % of it idle) far from zero, with a weight and a
bias that differ by channel."""


def test_planes_a_step_covers_are_stored_a_channel_at_a_time_and_pass_the_gate(tmp_path):
    """At 40×45 the store walks plane by plane (``BY_CHANNEL``); the 7×9 extra shape (63 values
    a plane, most of a step idle) takes the flat store. Both pass the gate."""
    found = instantiate(GROUP_NORM_PLANES)
    assert found is not None and "BY_CHANNEL=" in found.source
    assert_passes(gate(tmp_path, "gn_planes", GROUP_NORM_PLANES, "[[extra_shapes]]\nH = 7\nW = 9\n", found.source))


def test_the_store_reads_the_affine_map_once_a_channel_on_sm90(tmp_path):
    """Compiled for sm_90 without a GPU at 126×126 planes, the kernel's only scalar loads are the
    shift and one weight and one bias a channel, and the store runs in 16-byte vectors: the flat
    store gathered a weight and a bias for every element, behind an integer division by the
    plane's size (17 scalar loads and 71 integer multiply-adds a step before ``S`` was a
    compile-time size)."""
    ref, cand = tmp_path / "gnp.py", tmp_path / "gnp.new.py"
    ref.write_text(GROUP_NORM_PLANES)
    (tmp_path / "gnp.toml").write_text("[sizes.cuda]\nN = 4\nC = 64\nH = 126\nW = 126\n")
    cand.write_text(instantiate(GROUP_NORM_PLANES).source)
    run = subprocess.run([sys.executable, "-m", "kernelabd", "fingerprint", str(cand), "--arch", "sm_90", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    (kernel,) = json.loads(run.stdout)["kernels"]
    loads = kernel["instructions"]
    assert loads.get("LDG.32", 0) <= 3 and loads.get("STG.128", 0) > 0, loads
    assert kernel["spills"] == 0
