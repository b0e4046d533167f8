"""The reduction template beyond sum/mean/max over one dim: minimums (``amin``, ``torch.min(x,
dim)[0]``), reductions over neighbouring dims (a global average pool), logsumexp in rows, in
strided columns and split across programs, alone and as a pipeline's stage; each passes the
real gate on CPU (Triton interpreter). Dims that are not neighbours match nothing."""

from __future__ import annotations

import pytest

from kernelabd.propose.template.proposer import attempt
from tests.propose.test_template import assert_ported, reference

# name -> (forward, inputs, the edit): reductions a pipeline's tail ends with in KernelBench level
# 2 (a minimum over channels, a global average pool as a mean over neighbouring dims)
REDUCTIONS = {
    "min_values_over_a_dim": ("return torch.min(x, dim=1)[0]", "torch.randn(4, 7, 5)", "min over dim 1"),
    "amin_keepdim": ("return torch.amin(x, dim=-1, keepdim=True)", "torch.randn(4, 7, 5)", "min over dim -1"),
    "global_average_pool": ("return torch.mean(x, dim=(2, 3), keepdim=True)", "torch.randn(2, 3, 5, 6)",
                            "mean over dims 2-3"),
    "sum_over_the_last_two_dims": ("return x.sum(dim=[-1, -2])", "torch.randn(2, 3, 5, 6)", "sum over dims 2-3"),
    "conv_min_tanh": ("x = torch.min(self.conv(x), dim=1, keepdim=True)[0]\n    return torch.tanh(torch.tanh(x))",
                      "torch.randn(2, 3, 8, 8)", "min over dim 1"),
    "conv_pool_pool_mean": ("x = torch.mean(self.conv(x) * 0.5, dim=[2, 3], keepdim=True)\n"
                            "    return torch.mean(torch.mean(x, dim=[2, 3], keepdim=True))",
                            "torch.randn(2, 3, 8, 8)", "mean over every dim"),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_minimum_and_neighbouring_dim_reductions_pass_the_gate(tmp_path, name):
    forward, inputs, edit = REDUCTIONS[name]
    assert_ported(tmp_path, name, "self.conv = nn.Conv2d(3, 4, 3)\n", forward, inputs, edit)


def test_reductions_over_dims_apart_match_nothing():
    """``mean(x, (1, 3))`` is not one slice per output in the (outer, R, inner) view."""
    found = attempt(reference("def forward(self, x):\n    return x.mean(dim=[1, 3])\n",
                              inputs="torch.randn(2, 3, 5, 6)"))
    assert not hasattr(found, "source")


# name -> (init, forward, inputs): logsumexp, in rows and strided columns, split across programs
# (a long R over few outputs), and where KernelBench level 2 puts it (after a matmul, before an
# elementwise tail)
LOGSUMEXPS = {
    "rows": ("", "return torch.logsumexp(x, dim=-1)", "torch.randn(6, 37) * 4"),
    "strided_keepdim": ("", "return x.logsumexp(1, keepdim=True)", "torch.randn(3, 9, 5) * 4"),
    "split_over_programs": ("", "return torch.logsumexp(x, dim=0)", "torch.randn(20000, 2)"),
    "linear_logsumexp_gelu": ("self.fc = nn.Linear(10, 16)\n",
                              "return F.gelu(torch.logsumexp(self.fc(x), dim=1, keepdim=True))", "torch.randn(8, 10)"),
}


@pytest.mark.parametrize("name", sorted(LOGSUMEXPS))
def test_logsumexp_passes_the_gate(tmp_path, name):
    assert_ported(tmp_path, name, *LOGSUMEXPS[name], "logsumexp over dim")
