"""The conv2d template: an implicit-GEMM convolution with its epilogue passes the real gate on
CPU (Triton interpreter) for the bench problem and for an odd-sized strided, padded case, and a
convolution it does not implement (grouped, reflect-padded) matches nothing rather than being
ported wrong. Sizes are tiny: the interpreter runs every program in Python."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelabd.propose.template.proposer import instantiate
from kernelabd.propose.tune import apply_edit, parse_tunables
from tests.gating import assert_passes, gate
from tests.propose.test_template import reference, sidecar_of

PROBLEMS = Path(__file__).resolve().parents[2] / "bench" / "port" / "problems"


def conv_reference(conv: str, forward: str = "return self.conv(x)", inputs: str = "torch.randn(2, 3, 13, 11)",
                   extra_init: str = "") -> str:
    return reference(f"def forward(self, x):\n    {forward}\n", init=f"self.conv = {conv}\n{extra_init}",
                     inputs=inputs)


def test_bench_problem_conv2d_relu_biasadd_passes_the_gate(tmp_path):
    source = (PROBLEMS / "conv2d_relu_biasadd.py").read_text()
    sidecar = (PROBLEMS / "conv2d_relu_biasadd.toml").read_text()
    found = instantiate(source, sidecar_of(sidecar))
    assert found is not None, "no template matched the bench convolution"
    candidate, edit = found.source, found.edit
    assert found.dots == "tf32x3"
    assert edit == ("template: conv2d (conv2d + bias + relu + add) as implicit GEMM with fused epilogue; "
                    "3xTF32 dots")
    assert ', "tf32x3")' in candidate and "_operand(" not in candidate, "TF32 off; (C_out, 1, 1) read per channel"
    assert [t.name for t in parse_tunables(candidate)] == ["BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages",
                                                           "CHANNELS_LAST"]
    assert_passes(gate(tmp_path, "conv2d_relu_biasadd", source, sidecar, candidate))


@pytest.mark.parametrize("channels_last", [1, 0])
def test_strided_padded_conv_on_an_odd_size_passes_the_gate(tmp_path, channels_last):
    """Both K orders: (kh, kw, ci) over channels-last copies, the seed's, and (ci, kh, kw) over
    the operands as given."""
    source = conv_reference("nn.Conv2d(3, 5, 3, stride=2, padding=1, dilation=1)")
    found = instantiate(source)
    assert found is not None and found.edit.startswith("template: conv2d (conv2d + bias)")
    (flag,) = [t for t in parse_tunables(found.source) if t.name == "CHANNELS_LAST"]
    assert flag.current == 1
    candidate = apply_edit(found.source, flag, channels_last) if channels_last != flag.current else found.source
    assert_passes(gate(tmp_path, "conv_s2_p1", source, None, candidate))


def test_functional_dilated_conv_with_a_residual_passes_the_gate(tmp_path):
    """``F.conv2d`` with literal geometry (pairs, dilation 2, no bias), then a full-size residual
    read through ``_operand`` and a per-channel scale read per column."""
    source = reference(
        "def forward(self, x, r):\n"
        "    return F.conv2d(x, self.w, None, (1, 2), (2, 1), 2) * self.scale + r\n",
        init="self.w = nn.Parameter(torch.randn(4, 3, 3, 2))\nself.scale = nn.Parameter(torch.randn(4, 1, 1))\n",
        inputs="torch.randn(2, 3, 9, 10), torch.randn(2, 4, 9, 5)")
    found = instantiate(source)
    assert found is not None and found.edit.startswith("template: conv2d (conv2d + mul + add)")
    assert "_operand(r, _y.shape)" in found.source and "self.scale.stride(-3)" in found.source
    assert_passes(gate(tmp_path, "conv_functional", source, None, found.source))


@pytest.mark.parametrize("conv", [
    "nn.Conv2d(4, 6, 3, groups=2)",
    "nn.Conv2d(4, 6, 3, padding=1, padding_mode='reflect')",
])
def test_a_conv_the_template_does_not_implement_matches_nothing(conv):
    assert instantiate(conv_reference(conv, inputs="torch.randn(2, 4, 9, 9)")) is None


def test_a_conv_followed_by_an_unknown_op_matches_nothing():
    source = conv_reference("nn.Conv2d(3, 4, 3)", forward="return F.max_pool2d(self.conv(x), 2)")
    assert instantiate(source) is None
