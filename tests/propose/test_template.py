"""The template proposer end to end: each family's generated candidate passes the real gate on
CPU (Triton interpreter), carries TUNABLES for the tuner, and a plain reference dropped into a
real daemon ends with a verified template port."""

from __future__ import annotations

import json
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import torch

from kernelabd.harness.problem import Sidecar, load_sidecar
from kernelabd.propose.base import Budget, Candidate, Decline, JobContext, Proposal
from kernelabd.propose.template.proposer import NO_MATCH, TemplateProposer, instantiate
from kernelabd.propose.templates.common import OPERAND_HELPER
from kernelabd.propose.templates.matmul import PACK_HELPER
from kernelabd.propose.tune import parse_tunables
from tests.gating import assert_passes, gate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def reference(forward: str, init: str = "", init_args: str = "", inputs: str = "",
              init_values: str = "") -> str:
    """A KernelBench-style reference file around ``forward`` (a method, written flush left)."""
    body = textwrap.indent(textwrap.dedent(init), " " * 8)
    method = textwrap.indent(textwrap.dedent(forward), " " * 4)
    return (
        "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
        f"class Model(nn.Module):\n    def __init__(self{init_args}):\n"
        f"        super(Model, self).__init__()\n{body}\n{method}\n\n"
        f"def get_inputs():\n    return [{inputs}]\n\n\n"
        f"def get_init_inputs():\n    return [{init_values}]\n")


def assert_ported(tmp_path: Path, name: str, init: str, forward: str, inputs: str, edit: str,
                  params: str = "x") -> str:
    """The template candidate of ``return …`` (``forward``, its body, of ``params``) names
    ``edit`` and passes the real gate; its source, for further checks."""
    source = reference(f"def forward(self, {params}):\n    {forward}\n", init=init, inputs=inputs)
    found = instantiate(source)
    assert found is not None and edit in found.edit, found.edit if found else None
    assert_passes(gate(tmp_path, name, source, None, found.source))
    return found.source


# name -> (reference source, sidecar, words the edit line must contain)
REFERENCES: dict[str, tuple[str, str | None, str]] = {
    "log_softmax_mid_dim": (reference(
        "def forward(self, x):\n    return F.log_softmax(x, dim=1)\n",
        inputs="torch.randn(3, 97, 5)"), None, "log-softmax"),
    "layer_norm_no_affine_2d": (reference(
        "def forward(self, x):\n    return F.layer_norm(x, self.shape, eps=1e-6)\n",
        init="self.shape = (h, w)\n", init_args=", h: int, w: int", inputs="torch.randn(4, 7, 33)",
        init_values="7, 33"), None, "LayerNorm"),
    "rms_norm_weighted": (reference(
        """\
        def forward(self, x):
            variance = x.pow(2).mean(-1, keepdim=True)
            x = x * torch.rsqrt(variance + self.eps)
            return self.weight * x
        """,
        init="self.weight = nn.Parameter(torch.ones(dim))\nself.eps = eps\n",
        init_args=", dim: int, eps: float = 1e-6", inputs="torch.randn(2, 5, 769)",
        init_values="769, 1e-5"), None, "RMSNorm"),
    "rms_norm_features_dim": (reference(
        """\
        def forward(self, x):
            rms = torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + self.eps)
            return x / rms
        """,
        init="self.eps = eps\n", init_args=", eps: float", inputs="torch.randn(2, 13, 6, 5)",
        init_values="1e-5"), None, "RMSNorm"),
    "rms_norm_self_product": (reference(
        "def forward(self, x):\n    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)\n",
        inputs="torch.randn(4, 130)"), None, "RMSNorm (fused"),
    # Hugging Face's LlamaRMSNorm, word for word: fp32 upcast, then the cast back before the weight
    "rms_norm_llama_hf": (reference(
        """\
        def forward(self, hidden_states):
            input_dtype = hidden_states.dtype
            hidden_states = hidden_states.to(torch.float32)
            variance = hidden_states.pow(2).mean(-1, keepdim=True)
            hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
            return self.weight * hidden_states.to(input_dtype)
        """,
        init="self.weight = nn.Parameter(torch.ones(dim, dtype=torch.bfloat16))\nself.variance_epsilon = 1e-6\n",
        init_args=", dim: int", inputs="torch.randn(6, 300, dtype=torch.bfloat16)", init_values="300"),
        None, "RMSNorm (fused"),
    # the residual add before it, as a decoder layer writes it, normalised over a middle dim
    "rms_norm_of_residual_mid_dim": (reference(
        """\
        def forward(self, x, residual):
            h = (x + residual).float()
            h = h * torch.rsqrt(h.pow(2).mean(1, keepdim=True) + 1e-5)
            return h.to(x.dtype)
        """, inputs="torch.randn(3, 40, 5, dtype=torch.float16), torch.randn(3, 40, 5, dtype=torch.float16)"),
        None, "RMSNorm of an elementwise prologue (add)"),
    # KernelBench's losses: an elementwise prologue reduced over every element (a 0-d output),
    # with a broadcast between a (N, 1) prediction and (N,) targets
    "mse_loss": (reference("def forward(self, p, t):\n    return torch.mean((p - t) ** 2)\n",
                           inputs="torch.randn(300, 7), torch.randn(300, 7)"),
                 None, "mean over every dim of an elementwise prologue (sub, square)"),
    "hinge_loss_broadcast": (reference(
        "def forward(self, p, t):\n    return torch.mean(torch.clamp(1 - p * t, min=0))\n",
        inputs="torch.randn(129, 1), torch.randint(0, 2, (129,)).float() * 2 - 1"),
        None, "mean over every dim of an elementwise prologue (mul, sub, clamp_min)"),
    # a prologue reduced over a middle dim, kept
    "sum_of_sigmoid_product_mid_dim": (reference(
        "def forward(self, x, y):\n    return (torch.sigmoid(x) * y).sum(dim=1, keepdim=True)\n",
        inputs="torch.randn(3, 37, 5), torch.randn(3, 37, 5)"),
        None, "sum over dim 1 of an elementwise prologue (sigmoid, mul)"),
    "layer_norm_of_residual": (reference(
        "def forward(self, x, residual):\n    return self.ln(x + residual)\n",
        init="self.ln = nn.LayerNorm(n)\n", init_args=", n: int",
        inputs="torch.randn(3, 5, 700), torch.randn(3, 5, 700)", init_values="700"),
        None, "LayerNorm of an elementwise prologue (add)"),
    "softmax_of_scaled_biased": (reference(
        "def forward(self, x):\n    return torch.softmax(x * self.scale + self.bias, dim=1)\n",
        init="self.bias = nn.Parameter(torch.randn(c, 1))\nself.scale = scale\n",
        init_args=", c: int, scale: float", inputs="torch.randn(4, 33, 6)", init_values="33, 0.5"),
        None, "softmax of an elementwise prologue (mul, add)"),
    "elementwise_broadcast_chain": (reference(
        "def forward(self, x, y):\n"
        "    z = torch.relu((x - y) * self.scale / 2.0 + self.shift)\n"
        "    return F.silu(z) + torch.tanh(x) * torch.exp(-y) + F.gelu(z)\n",
        init="self.shift = nn.Parameter(torch.randn(c, 1, 1))\nself.scale = scale\n",
        init_args=", c: int, scale: float", inputs="torch.randn(2, 3, 7, 5), torch.randn(2, 3, 7, 5)",
        init_values="3, 0.75"), None, "elementwise chain of"),
    "sum_mid_dim": (reference(
        "def forward(self, x):\n    return torch.sum(x, dim=1)\n",
        inputs="torch.randn(3, 1023, 7)"), None, "sum over dim 1"),
    "mean_last_keepdim": (reference(
        "def forward(self, x):\n    return x.mean(dim=-1, keepdim=True)\n",
        inputs="torch.randn(5, 1001)"), None, "mean over dim -1"),
    "max_values_dim0": (reference(
        "def forward(self, x):\n    return torch.max(x, dim=0)[0]\n",
        inputs="torch.randn(97, 3, 4)"), None, "max over dim 0"),
    "linear_relu_residual": (reference(
        "def forward(self, x, r):\n    return torch.relu(self.fc(x)) + r * 0.5\n",
        init="self.fc = nn.Linear(k, n)\n", init_args=", k: int, n: int",
        inputs="torch.randn(2, 19, 45), torch.randn(2, 19, 37)", init_values="45, 37"),
        None, "linear + bias + relu"),
    # a per-row (M, 1) operand in a product's epilogue, read in place (``_operand``'s divisor)
    "linear_row_scale": (reference(
        "def forward(self, x):\n    return self.fc(x) * self.rows\n",
        init="self.fc = nn.Linear(k, n)\nself.rows = nn.Parameter(torch.randn(19, 1))\n",
        init_args=", k: int, n: int", inputs="torch.randn(19, 45)", init_values="45, 37"),
        None, "linear + bias + mul"),
    "matmul_gelu_scale_tf32_allowed": (reference(
        "def forward(self, a, b):\n    return F.gelu(torch.matmul(a, b)) * 2.0\n",
        inputs="torch.randn(33, 40), torch.randn(40, 21)"), "tf32 = true\n", "matmul + gelu"),
    "gated_mlp": (reference(
        "def forward(self, x):\n    return self.w2(F.silu(self.w1(x)) * self.w3(x))\n",
        init=("self.w1 = nn.Linear(dim, hidden, bias=False)\n"
              "self.w3 = nn.Linear(dim, hidden, bias=False)\n"
              "self.w2 = nn.Linear(hidden, dim, bias=False)\n"),
        init_args=", dim: int, hidden: int", inputs="torch.randn(3, 11, 24)",
        init_values="24, 40"), None, "gated MLP"),
    "linear_gelu_softmax": (reference(
        "def forward(self, x):\n    return F.softmax(F.gelu(self.linear(x)), dim=1)\n",
        init="self.linear = nn.Linear(k, n)\n", init_args=", k: int, n: int",
        inputs="torch.randn(19, 45)", init_values="45, 37"), None, "then softmax"),
    # bfloat16 through tl.dot: the interpreter needs the templates' fp32 widening (see _dot)
    "gated_mlp_bf16": (reference(
        "def forward(self, x):\n    return self.w2(F.silu(self.w1(x)) * self.w3(x))\n",
        init=("self.w1 = nn.Linear(dim, hidden, bias=False, dtype=torch.bfloat16)\n"
              "self.w3 = nn.Linear(dim, hidden, bias=False, dtype=torch.bfloat16)\n"
              "self.w2 = nn.Linear(hidden, dim, bias=False, dtype=torch.bfloat16)\n"),
        init_args=", dim: int, hidden: int", inputs="torch.randn(37, 48, dtype=torch.bfloat16)",
        init_values="48, 80"), None, "gated MLP"),
    # x / ‖x‖ along a dim: the row kernel, one read of each slice, not a sum and then a division
    "l2_normalise": (reference(
        "def forward(self, x):\n    return x / torch.norm(x, p=2, dim=1, keepdim=True)\n",
        inputs="torch.randn(7, 300)"), None, "L2 normalisation (fused"),
    "l2_normalise_eps_middle_dim": (reference(
        "def forward(self, x):\n    return x * torch.rsqrt((x * x).sum(1, keepdim=True) + 1e-6)\n",
        inputs="torch.randn(3, 50, 6)"), None, "L2 normalisation (fused"),
    # a constructor sized by module constants, one made from another, and a gate shape that
    # changes them: the candidate copies the constants, and the harness sets each shape's
    "linear_sized_by_module_constants": (
        "import torch\nimport torch.nn as nn\n\nfeatures = 40\nhidden = features + 8\n\n\n"
        "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc = nn.Linear(features, hidden)\n\n"
        "    def forward(self, x):\n        return torch.relu(self.fc(x))\n\n\nbatch = 19\n\n\n"
        "def get_inputs():\n    return [torch.randn(batch, features)]\n\n\n"
        "def get_init_inputs():\n    return []\n",
        "[[extra_shapes]]\nfeatures = 24\nbatch = 7\n", "linear + bias + relu"),
}
EXAMPLE_NAMES = ["softmax", "layernorm", "gelu_gate", "matmul"]


def sidecar_of(text: str | None) -> Sidecar:
    """``NAME.toml`` as the daemon hands it to proposers: parsed by the harness's own loader."""
    if text is None:
        return Sidecar()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.toml"
        path.write_text(text)
        return load_sidecar(path)


def context(source: str, sidecar: str | None = None,
            history: tuple[Candidate, ...] = ()) -> JobContext:
    return JobContext(job_id=1, problem="p", reference_source=source, device="cpu",
                      budget=Budget(10, 600.0), sidecar=sidecar_of(sidecar), history=history)


def cases() -> list[tuple[str, str, str | None, str]]:
    found = [(n, src, side, words) for n, (src, side, words) in REFERENCES.items()]
    for name in EXAMPLE_NAMES:
        side = EXAMPLES / f"{name}.toml"
        found.append((f"example_{name}", (EXAMPLES / f"{name}.py").read_text(),
                      side.read_text() if side.exists() else None, "template:"))
    return found


@pytest.mark.parametrize(("name", "source", "sidecar", "words"), cases(), ids=[c[0] for c in cases()])
def test_generated_candidate_passes_the_real_gate(tmp_path, name, source, sidecar, words):
    proposal = TemplateProposer().propose(context(source, sidecar))
    assert not isinstance(proposal, Decline), f"{name}: no template matched"
    assert proposal.edit.startswith("template:") and words in proposal.edit and "\n" not in proposal.edit
    assert proposal.parent_id is None
    assert parse_tunables(proposal.source) and proposal.params
    again = TemplateProposer().propose(context(source, sidecar))
    assert again.source == proposal.source, "generation is deterministic"
    assert_passes(gate(tmp_path, name, source, sidecar, proposal.source))


def test_tf32_dots_only_when_the_sidecar_allows_them():
    """Without TF32, fp32 dots start as 3xTF32 (fp32-accurate on the tensor cores)."""
    source = REFERENCES["matmul_gelu_scale_tf32_allowed"][0]
    strict = TemplateProposer().propose(context(source))
    loose = TemplateProposer().propose(context(source, "tf32 = true\n"))
    assert ', "tf32x3")' in strict.source and ', "tf32")' not in strict.source
    assert strict.edit.endswith("; 3xTF32 dots")
    assert ', "tf32")' in loose.source and "3xTF32" not in loose.edit


def test_ieee_dots_follow_only_a_3xtf32_seed_that_did_not_pass():
    source = REFERENCES["matmul_gelu_scale_tf32_allowed"][0]
    seed = TemplateProposer().propose(context(source))
    failed = Candidate(id=1, proposer="template", source=seed.source, state="done", verdict="fail",
                       rule="numerics")
    exact = TemplateProposer().propose(context(source, history=(failed,)))
    assert exact.parent_id is None
    assert ', "ieee")' in exact.source and "tf32x3" not in exact.source
    assert exact.edit.endswith("; IEEE dots (the 3xTF32 seed did not pass: numerics)")
    passed = Candidate(id=1, proposer="template", source=seed.source, state="done", verdict="pass")
    assert TemplateProposer().propose(context(source, history=(passed,))) == Decline()
    second = Candidate(id=2, proposer="template", source=exact.source, state="done", verdict="fail")
    assert TemplateProposer().propose(context(source, history=(failed, second))) == Decline()


def test_half_precision_dots_stay_plain_and_start_on_larger_tiles():
    source = reference("def forward(self, a, b):\n    return a @ b\n",
                       inputs="torch.randn(33, 40, dtype=torch.bfloat16), "
                              "torch.randn(40, 21, dtype=torch.bfloat16)")
    proposal = TemplateProposer().propose(context(source))
    assert ', "ieee")' in proposal.source and "tf32" not in proposal.edit
    assert proposal.params["BLOCK_K"] == 64 and proposal.params["PACK"] == 2, \
        "bf16 dots take B as it is, packed only where a descriptor cannot read it"


@pytest.mark.parametrize("forward", [
    "def forward(self, x):\n    return torch.cumsum(x, dim=1)\n",
    "def forward(self, x):\n    return torch.softmax(x, dim=-1), x.sum()\n",
    "def forward(self, x):\n    if x.sum() > 0:\n        return x\n    return -x\n",
    "def forward(self, x):\n    return torch.max(x, dim=1)[1]\n",
])
def test_a_reference_that_matches_nothing_is_declined_with_the_reason(forward):
    source = reference(forward, inputs="torch.randn(4, 8)")
    declined = TemplateProposer().propose(context(source))
    assert isinstance(declined, Decline) and declined.reason.startswith(NO_MATCH), declined


def test_proposes_once_per_job():
    source = (EXAMPLES / "softmax.py").read_text()
    first = TemplateProposer().propose(context(source))
    done = Candidate(id=1, proposer="template", source=first.source, state="done", verdict="pass")
    assert TemplateProposer().propose(context(source, history=(done,))) == Decline()


@pytest.mark.slow
def test_plain_reference_in_the_inbox_ends_done_with_a_template_port(kit):
    kit.home.config.write_text(kit.home.config.read_text().replace(
        'proposers = ["tune"]', 'proposers = ["template", "tune"]'))
    (kit.home.inbox / "rmsnorm.py").write_text(REFERENCES["rms_norm_weighted"][0])
    daemon = kit.daemon("--once")
    assert daemon.proc.wait(300) == 0, daemon.output()
    job = kit.job_of("rmsnorm.py")
    assert job["state"] == "done", job
    best = kit.home.results / "rmsnorm" / "best.py"
    assert best.read_text().startswith('"""Template: RMSNorm')
    report = json.loads((kit.home.results / "rmsnorm" / "report.json").read_text())
    assert report["lineage"][0]["edit"] == "template: RMSNorm (fused, one pass)"


PACK_CHECK = """
import torch
import triton
import triton.language as tl
{helper}
weight = torch.randn(24, 32)                        # nn.Linear's (N, K), K a multiple of 16
assert _k_major(weight, 32) is weight, "already K-major and aligned: no copy"
b = torch.randn(40, 24)                             # a (K, N) right operand, K = 40
packed = _k_major(b.t(), 48)
assert packed.is_contiguous() and packed.shape == (24, 48)
assert torch.equal(packed[:, :40], b.t()) and not packed[:, 40:].any(), "K padded with zeros"
odd = torch.randn(7, 33)
assert torch.equal(_k_major(odd, 48)[:, :33], odd)
heads = torch.randn(2, 3, 40, 70).transpose(2, 3)   # (batch, heads, rows, K) views, rows past one tile
packed = _k_major(heads, 48)
assert packed.is_contiguous() and packed.shape == (2, 3, 70, 48)
assert torch.equal(packed[..., :40], heads) and not packed[..., 40:].any()
print("ok")
"""


def test_operands_are_read_in_place_unless_their_broadcast_needs_a_copy():
    """``_operand``'s layout: output flat index ``k`` reads element ``k // d % n``, or ``k``
    itself where ``n`` is 0. A bias, a per-channel ``(C, 1, 1)`` scale, a per-row ``(M, 1)`` one
    and a full tensor are read where they lie (BatchNorm's four per-channel vectors used to become
    four full-size copies); only a broadcast inside the operand's dims or a non-contiguous one is
    expanded. A full-size operand and a copy are read at ``k`` (``n`` 0), so that the kernel's
    loads keep the output's contiguity."""
    scope: dict = {}
    exec("import math\nimport torch\n" + OPERAND_HELPER, scope)
    operand = scope["_operand"]

    def read(laid: torch.Tensor, n: int, d: int, numel: int) -> torch.Tensor:
        k = torch.arange(numel)
        return laid.reshape(-1)[k if n == 0 else k // d % n]

    out = torch.Size((2, 3, 4, 5))
    for shape, in_place, at_k in [((3, 1, 1), True, False), ((5,), True, False), ((2, 1, 1, 1), True, False),
                                  ((1, 3, 4, 5), True, False), ((2, 3, 4, 5), True, True), ((), True, False),
                                  ((4, 1), True, False), ((3, 1, 5), False, True), ((2, 1, 4, 1), False, True)]:
        t = torch.randn(shape)
        laid, n, d = operand(t, out)
        assert (laid.data_ptr() == t.data_ptr()) == in_place, shape
        assert (n == 0) == at_k, shape
        assert torch.equal(read(laid, n, d, out.numel()), t.expand(out).reshape(-1)), shape
    wide = torch.randn(5, 3).t()                        # a transposed view: not contiguous
    laid, n, d = operand(wide, torch.Size((2, 3, 5)))
    assert laid.is_contiguous() and n == 0 and torch.equal(read(laid, n, d, 30), wide.expand(2, 3, 5).reshape(-1))


def test_packing_copies_only_operands_that_are_not_k_major_and_aligned(tmp_path):
    """``PACK``: TF32 tensor-core products take both operands K-major with 16-byte aligned rows,
    so ``_k_major`` copies an operand that is not (zero-padding K, in one Triton launch, here
    interpreted) and leaves one that is; batched and per-head operands are copied whole."""
    import os
    import subprocess
    import sys

    script = tmp_path / "pack.py"              # Triton reads a kernel's source from its file
    script.write_text(PACK_CHECK.replace("{helper}", PACK_HELPER))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


SETTINGS_SWEEP = """
import importlib.util, json, sys
import torch
spec = importlib.util.spec_from_file_location("candidate", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
gen = torch.Generator().manual_seed(3)
model = module.ModelNew(*json.loads(sys.argv[2]))
for p in model.parameters():
    p.data = torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5
inputs = [torch.randn(s, generator=gen) for s in json.loads(sys.argv[3])]
out = {}
for settings in json.loads(sys.argv[4]):
    for name, value in settings.items():
        if hasattr(module, name):
            setattr(module, name, value)
    out[json.dumps(settings)] = model(*inputs).double().tolist()
print(json.dumps(out))
"""


def sweep_settings(tmp_path: Path, source: str, init_values: list, shapes: list, settings: list[dict]) -> None:
    """Run the template's candidate for ``source`` under each of ``settings`` (module-level
    tunables; names the candidate lacks are skipped) in the interpreter and hold every output to
    the reference's in float64. A subprocess: the interpreter must be on before Triton loads."""
    import os
    import subprocess
    import sys

    proposal = TemplateProposer().propose(context(source))
    assert isinstance(proposal, Proposal)
    cand = tmp_path / "cand.py"
    cand.write_text(proposal.source)
    run = subprocess.run([sys.executable, "-c", SETTINGS_SWEEP, str(cand), json.dumps(init_values),
                          json.dumps(shapes), json.dumps(settings)],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert run.returncode == 0, run.stderr
    space: dict = {}
    exec(source, space)
    model = space["Model"](*init_values).double()
    gen = torch.Generator().manual_seed(3)
    for p in model.parameters():
        p.data = (torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5).double()
    inputs = [torch.randn(s, generator=gen).double() for s in shapes]
    with torch.no_grad():
        want = model(*inputs)
    outputs = json.loads(run.stdout)
    assert len(outputs) == len(settings)
    for setting, out in outputs.items():
        err = float((torch.tensor(out, dtype=torch.float64) - want).abs().max() / want.abs().max())
        assert err < 1e-5, f"{setting}: relative error {err:.2e}"


MLP = ("def forward(self, x):\n    return self.w2(F.silu(self.w1(x)) * self.w3(x))\n",
       "self.w1 = nn.Linear(dim, hidden, bias=False)\nself.w3 = nn.Linear(dim, hidden, bias=False)\n"
       "self.w2 = nn.Linear(hidden, dim, bias=False)\n", ", dim: int, hidden: int")
TILES = [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 4, "PACK": pack, "DOWN_BLOCK_N": down}
         for bm, bn, bk, pack, down in [(16, 16, 16, 0, 32), (32, 16, 32, 1, 16), (16, 32, 64, 0, 16),
                                        (64, 64, 16, 1, 64)]]


@pytest.mark.parametrize(("forward", "init", "init_args", "init_values", "shapes"), [
    # K a multiple of every BLOCK_K tried (the unmasked K loop) and K = 40 (the masked one); M and
    # N never whole tiles (wrapped loads, masked store)
    ("def forward(self, a, b):\n    return a @ b\n", "", "", [], [[33, 64], [64, 21]]),
    ("def forward(self, a, b):\n    return a @ b\n", "", "", [], [[33, 40], [40, 21]]),
    (*MLP, [64, 128], [[37, 64]]),
    (*MLP, [48, 80], [[37, 48]]),
])
def test_matmul_tiles_hold_whole_and_partial_k_steps(tmp_path, forward, init, init_args, init_values, shapes):
    """Every tile the tuner may pick gives the float64 product, whether K is walked in whole
    steps (loads without bounds checks) or not, and with M and N never whole tiles; the gated
    MLP's down projection on a tile width of its own."""
    source = reference(forward, init=init, init_args=init_args,
                       inputs=", ".join(f"torch.randn({s[0]}, {s[1]})" for s in shapes),
                       init_values=", ".join(map(str, init_values)))
    sweep_settings(tmp_path, source, init_values, shapes, TILES)


@pytest.mark.parametrize("name", ["layer_norm_no_affine_2d", "rms_norm_weighted", "log_softmax_mid_dim"])
def test_row_kernels_hold_for_every_launch_shape(tmp_path, name):
    """Persistent programs (a few an SM, pipelined or not), a program a slice (``PER_SM = 0``)
    and the evict-first load all give the float64 result, rows or strided slices alike."""
    source = REFERENCES[name][0]
    space: dict = {}
    exec(source, space)
    shapes = [list(t.shape) for t in space["get_inputs"]()]
    settings = [{"PER_SM": per_sm, "STAGES": stages, "EVICT": evict, "PER_THREAD": per_thread}
                for per_sm, stages, evict, per_thread in [(0, 1, 0, 16), (0, 1, 1, 4), (1, 2, 1, 8),
                                                          (2, 3, 0, 32)]]
    sweep_settings(tmp_path, source, list(space["get_init_inputs"]()), shapes, settings)


def test_prepare_starts_recognition_in_the_background_and_the_proposal_uses_its_answer(tmp_path):
    """The loop calls ``prepare`` when the job starts, before the reference's session opens: the
    recognition subprocess runs then (the reference below notes each import of itself), and the
    first proposal takes its answer instead of recognising again."""
    imports = tmp_path / "imports.txt"
    source = (EXAMPLES / "softmax.py").read_text() + \
        f"\nwith open({str(imports)!r}, 'a') as _f:\n    _f.write('imported\\n')\n"
    proposer = TemplateProposer()
    proposer.prepare(context(source))
    deadline = time.monotonic() + 120
    while not imports.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert imports.exists(), "recognition started before any proposal was asked for"
    proposal = proposer.propose(context(source))
    assert isinstance(proposal, Proposal) and proposal.edit.startswith("template:")
    proposer.close()
    assert imports.read_text().count("imported") == 1, "recognised once, in the background"
