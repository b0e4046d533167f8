"""The pooling template: max and average pooling over 1-3 axes (stride, padding, dilation,
``count_include_pad``), alone and as a pipeline's stage, a global average pool as a mean over
the spatial dims; each passes the real gate on CPU (Triton interpreter). What it does not port
(an average's ``ceil_mode``, indices, a divisor override, other adaptive sizes) matches nothing."""

from __future__ import annotations

import pytest

from kernelabd.propose.template.proposer import attempt
from tests.propose.test_template import assert_ported, reference

# name -> (init, forward, inputs, the edit): pooling, alone and after a convolution, as KernelBench
# writes it (levels 1 and 2)
POOLS = {
    "max_pool2d_module": ("self.pool = nn.MaxPool2d(3, stride=2, padding=1, dilation=1)\n", "return self.pool(x)",
                          "torch.randn(2, 3, 9, 8)", "max pool 2-D, window 3×3, stride 2×2"),
    "max_pool1d_dilated": ("", "return F.max_pool1d(x, 3, 2, 1, 2)", "torch.randn(2, 3, 17)",
                           "max pool 1-D, window 3, stride 2"),
    "avg_pool3d_padded": ("self.pool = nn.AvgPool3d(2, padding=1)\n", "return self.pool(x)",
                          "torch.randn(2, 3, 5, 4, 6)", "avg pool 3-D, window 2×2×2, stride 2×2×2"),
    "avg_pool2d_excluding_padding": ("", "return F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)",
                                     "torch.randn(2, 3, 6, 7)", "avg pool 2-D, window 3×3, stride 1×1"),
    "max_pool2d_ceil_mode_overhanging": ("self.pool = nn.MaxPool2d(3, stride=2, ceil_mode=True)\n",
                                         "return self.pool(x)", "torch.randn(2, 3, 8, 9)",
                                         "max pool 2-D, window 3×3, stride 2×2, ceil mode"),
    "conv_relu_maxpool_sum": ("self.conv = nn.Conv2d(3, 4, 3)\nself.pool = nn.MaxPool2d(2)\n",
                              "return torch.sum(self.pool(torch.relu(self.conv(x))), dim=1)",
                              "torch.randn(2, 3, 10, 9)", "max pool 2-D, window 2×2"),
    "conv3d_global_avg_pool": ("self.conv = nn.Conv3d(3, 4, 3)\nself.pool = nn.AdaptiveAvgPool3d(1)\n",
                               "return torch.sigmoid(self.pool(self.conv(x)))", "torch.randn(2, 3, 5, 6, 5)",
                               "mean over dims 2-4"),
}


@pytest.mark.parametrize("name", sorted(POOLS))
def test_pooling_passes_the_gate(tmp_path, name):
    assert_ported(tmp_path, name, *POOLS[name])


def test_average_pooling_with_ceil_mode_or_pooling_with_indices_matches_nothing():
    for pool in ("nn.AvgPool2d(2, ceil_mode=True)", "nn.MaxPool2d(2, return_indices=True)",
                 "nn.AvgPool2d(2, divisor_override=3)", "nn.AdaptiveAvgPool2d(2)"):
        source = reference("def forward(self, x):\n    return self.pool(x)\n", init=f"self.pool = {pool}\n",
                           inputs="torch.randn(2, 3, 7, 6)")
        assert not hasattr(attempt(source), "source"), pool
