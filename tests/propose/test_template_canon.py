"""Matching that survives real references: casts, views, in-place ops, functional and module
forms, dropout and BatchNorm in eval each reach the template of the computation they write, and
the candidate computes in the reference's precision and returns its dtype and shape (the real
gate, on CPU under the Triton interpreter, says so)."""

from __future__ import annotations

import pytest

from kernelabd.harness.problem import Sidecar
from kernelabd.propose.base import Decline
from kernelabd.propose.template.proposer import NO_MATCH, TemplateProposer, attempt
from tests.gating import assert_passes, gate
from tests.propose.test_template import context, reference

BF16 = "dtype=torch.bfloat16"

# name -> (reference source, words the edit line must contain)
REFERENCES: dict[str, tuple[str, str]] = {
    # a number the forward is given beside a tensor (KernelBench L1 #5's ``A * s``): a scalar
    "number_input": (reference("def forward(self, A, s):\n    return A * s\n", inputs="torch.randn(6, 5), 3.5"),
                     "elementwise chain of 1 ops (mul)"),
    # the two misses: RMSNorm written with fp32 casts in bf16, softmax over an odd width
    "rms_norm_bf16_casts": (reference(
        """\
        def forward(self, x):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return (h * self.weight).to(x.dtype)
        """, init="self.eps = eps\nself.weight = nn.Parameter(torch.ones(dim))\n",
        init_args=", dim: int, eps: float = 1e-6", inputs=f"torch.randn(3, 7, 769, {BF16})",
        init_values="769"), "RMSNorm"),
    "softmax_odd_width_bf16_casts": (reference(
        "def forward(self, x):\n    return torch.softmax(x.float(), dim=-1).type_as(x)\n",
        inputs=f"torch.randn(6, 1023, {BF16})"), "softmax"),
    # the reference keeps the fp32 result: the template reads the widened input and stores fp32
    "log_softmax_bf16_to_fp32": (reference(
        "def forward(self, x):\n    return F.log_softmax(x, dim=1, dtype=torch.float32)\n",
        inputs=f"torch.randn(4, 333, {BF16})"), "log-softmax"),
    # every in-place form; later readers of x see what the mutations made of it
    "in_place_chain": (reference(
        """\
        def forward(self, x, y):
            x = x * 2.0
            x.relu_()
            x += y
            torch.sigmoid_(x)
            z = F.relu(x - 0.5, inplace=True)
            x.mul_(3.0)
            return x - z
        """, inputs="torch.randn(5, 37), torch.randn(5, 37)"), "elementwise chain"),
    # activations beyond the templates' own table, as functions, methods and modules
    "activations": (reference(
        """\
        def forward(self, x):
            y = self.leaky(x) + F.elu(x, alpha=0.7) + torch.selu(x) + F.hardtanh(x, -0.5, 0.8)
            y = y + F.relu6(x * 4.0) + F.hardsigmoid(x) + self.hswish(x) + self.softplus(x)
            y = y + F.softsign(x) + F.mish(x) + x.clamp(min=-0.3) + torch.clamp(x, -1.0, 2.0).abs()
            return torch.maximum(y, x * 0.1)
        """, init=("self.leaky = nn.LeakyReLU(slope)\nself.hswish = nn.Hardswish()\n"
                   "self.softplus = nn.Softplus(beta=2.0, threshold=5.0)\n"),
        init_args=", slope: float", inputs="torch.randn(3, 5, 41)", init_values="0.2"), "elementwise chain"),
    # views of inputs are operand expressions; the final view gives the output its shape
    "views_around_a_softmax": (reference(
        "def forward(self, x):\n    y = torch.softmax(x.view(-1, x.size(-1)), dim=1)\n"
        "    return y.view(x.size(0), -1)\n", inputs="torch.randn(3, 5, 77)"), "softmax"),
    # dropout computes nothing in eval; BatchNorm in eval is the affine map it applies
    "linear_dropout_batchnorm_gelu": (reference(
        """\
        def forward(self, x):
            y = self.drop(self.fc(x))
            y = F.dropout(y, 0.2, training=self.training)
            return F.gelu(self.bn(y))
        """, init="self.fc = nn.Linear(k, n)\nself.drop = nn.Dropout(0.5)\nself.bn = nn.BatchNorm1d(n)\n",
        init_args=", k: int, n: int", inputs="torch.randn(19, 45)", init_values="45, 37"), "matmul"),
    "conv_batchnorm_relu": (reference(
        "def forward(self, x):\n    return torch.relu(self.bn(self.conv(x)))\n",
        init="self.conv = nn.Conv2d(3, 8, 3)\nself.bn = nn.BatchNorm2d(8)\n",
        inputs="torch.randn(2, 3, 9, 11)"), "conv2d"),
    # vector norms are the reductions they compute: KernelBench L1 #39's and #37's forms, F.normalize
    # (a norm over one dim, then a division by it, is a row kernel)
    "l2_normalised_over_dim1": (reference(
        "def forward(self, x):\n    return x / torch.norm(x, p=2, dim=1, keepdim=True)\n",
        inputs="torch.randn(6, 70, 3)"), "L2 normalisation (fused"),
    "frobenius_normalised": (reference(
        "def forward(self, x):\n    return x / torch.norm(x, p='fro')\n",
        inputs="torch.randn(3, 5, 40)"), "elementwise chain of 2 ops (sqrt → div)"),
    "f_normalize": (reference(
        "def forward(self, x):\n    return F.normalize(x, dim=-1)\n", inputs="torch.randn(4, 7, 33)"),
        "L2 normalisation (F.normalize) (fused"),
    "max_norm_normalised": (reference(
        "def forward(self, x):\n    return x / torch.linalg.vector_norm(x, float('inf'), -1, True)\n",
        inputs="torch.randn(4, 7, 33)"), "max over dim -1 of an elementwise prologue (abs)"),
    # a product of widened bf16 operands: bf16 products are exact in the fp32 accumulator, and
    # the fp32 result is stored as fp32
    "matmul_of_widened_bf16": (reference(
        "def forward(self, a, b):\n    return a.float() @ b.T.float()\n",
        inputs=f"torch.randn(33, 48, {BF16}), torch.randn(21, 48, {BF16})"), "matmul"),
}


@pytest.mark.parametrize("name", list(REFERENCES))
def test_canonical_forms_reach_their_template_and_pass_the_real_gate(tmp_path, name):
    source, words = REFERENCES[name]
    proposal = TemplateProposer().propose(context(source))
    assert not isinstance(proposal, Decline), f"{name}: {proposal.reason}"
    assert words in proposal.edit, proposal.edit
    assert_passes(gate(tmp_path, name, source, None, proposal.source))


@pytest.mark.parametrize(("forward", "inputs", "why"), [
    # the mutation reaches y through the view: reading y afterwards sees it
    ("def forward(self, x):\n    y = x * 2.0\n    v = y.view(-1)\n    v.relu_()\n    return y + 1.0\n",
     "torch.randn(4, 8)", "writes through a view"),
    # PyTorch's promotion makes the output fp32 from a bf16 input: no template stores that
    ("def forward(self, x):\n    return x * self.w\n", f"torch.randn(4, 8, {BF16})", "the result is torch.float32"),
    ("def forward(self, x):\n    return torch.cumsum(x, dim=1)\n", "torch.randn(4, 8)", "torch.cumsum (cumsum)"),
    ("def forward(self, x):\n    return torch.norm(x, p=3, dim=1)\n", "torch.randn(4, 8)", "torch.norm (norm)"),
])
def test_what_no_template_computes_is_declined_naming_the_node(forward, inputs, why):
    source = reference(forward, init="self.w = nn.Parameter(torch.randn(8))\n", inputs=inputs)
    found = attempt(source, Sidecar())
    assert not hasattr(found, "source") and found.reason.startswith(NO_MATCH) and why in found.reason, found


def test_a_bf16_rounding_between_ops_is_kept():
    """``.half()`` between two ops rounds there in the reference; the chain rounds there too."""
    source = reference("def forward(self, x):\n    return (x * 3.0).half().float() + 1.0\n",
                       inputs="torch.randn(4, 8)")
    found = attempt(source, Sidecar())
    assert "round_fp16" in found.edit and ".to(tl.float16).to(tl.float32)" in found.source


def test_a_constant_made_in_forward_is_the_number_it_holds():
    """fx keeps ``torch.tensor(0.25)`` as a constant of the traced module, which the candidate's
    model does not have: one element is read as the number it is."""
    source = reference("def forward(self, x):\n    return torch.maximum(x, torch.tensor(0.25)) * 2.0\n",
                       inputs="torch.randn(4, 8)")
    found = attempt(source, Sidecar())
    assert "maximum" in found.edit and "float(0.25)" in found.source and "_tensor_constant" not in found.source
