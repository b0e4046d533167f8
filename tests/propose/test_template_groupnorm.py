"""The GroupNorm template (module and ``F.`` forms, with and without the affine map), alone and
as a pipeline's stage after a transposed convolution or a matmul, and on a group spanning
several steps far from zero (its one-read statistics); each passes the real gate on CPU (Triton
interpreter)."""

from __future__ import annotations

import pytest

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
