"""The attention template: SDPA and the written-out softmax(q kᵀ·scale) v are recognised, the
generated flash-style candidate passes the real gate on CPU (Triton interpreter) at odd sequence
lengths, its online softmax holds for every block shape the tuner may pick, its output layout
follows PyTorch's own SDPA (the gate compares strides), heads wider than a program holds take
the materialised form, and attention with anything the kernel does not compute (a mask,
dropout, an extra term) matches nothing, or runs as a pipeline of other templates."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernelabd.propose.base import Decline
from kernelabd.propose.template.proposer import NO_MATCH, TemplateProposer, instantiate
from kernelabd.propose.templates import attention
from kernelabd.propose.tune import parse_tunables, with_params
from tests.gating import assert_passes, gate
from tests.propose.test_template import context, reference

QKV = "torch.randn(1, 2, 77, 64), torch.randn(1, 2, 77, 64), torch.randn(1, 2, 77, 64)"
SDPA = "def forward(self, q, k, v):\n    return F.scaled_dot_product_attention(q, k, v{})\n"

CAUSAL_BUFFER = "self.register_buffer('bias', torch.tril(torch.ones(96, 96)).view(1, 1, 96, 96))\n"
# name -> (reference source, words the edit line must contain)
REFERENCES: dict[str, tuple[str, str]] = {
    "sdpa": (reference(SDPA.format(""), inputs=QKV), "(scaled_dot_product_attention;"),
    "sdpa_causal_scale": (reference(SDPA.format(", is_causal=True, scale=self.scale"),
                                    init="self.scale = scale\n", init_args=", scale: float",
                                    inputs=QKV, init_values="0.2"),
                          "(scaled_dot_product_attention, causal;"),
    "written_out": (reference(
        """\
        def forward(self, q, k, v):
            scores = torch.matmul(q, k.transpose(-2, -1)) / (q.size(-1) ** 0.5)
            return F.softmax(scores, dim=-1) @ v
        """, inputs=QKV), "written-out"),
    # the scale as model code writes it: a function of a size, recomputed in the candidate
    "written_out_math_sqrt": ("import math\n" + reference(
        """\
        def forward(self, q, k, v):
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
            return torch.softmax(scores, dim=-1) @ v
        """, inputs=QKV), "written-out"),
    # (B, S, D), keys longer than queries, a value head dim of its own, a scaled query
    "written_out_3d": (reference(
        "def forward(self, q, k, v):\n    return torch.bmm((q * 0.125 @ k.mT).softmax(-1), v)\n",
        inputs="torch.randn(3, 77, 40), torch.randn(3, 90, 40), torch.randn(3, 90, 24)"), "written-out"),
    # (B, S, H, D) inputs transposed as views: the kernel reads them (and writes the output)
    # through strides, in the layout PyTorch's SDPA returns
    "sdpa_bshd_views": (reference(
        "def forward(self, q, k, v):\n"
        "    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),\n"
        "                                          v.transpose(1, 2), is_causal=True)\n",
        inputs="torch.randn(1, 77, 2, 32), torch.randn(1, 77, 2, 32), torch.randn(1, 77, 2, 32)"),
        "causal;"),
    # the heads joined again after the attention: the output's own views, made on the result
    "sdpa_heads_joined": (reference(
        "def forward(self, q, k, v):\n"
        "    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, 77, 128)\n", inputs=QKV),
        "(scaled_dot_product_attention; flash-style, online softmax); output viewed as it returns it"),
    # minGPT's causal mask: a tril buffer sliced to the traced length (a size torch.fx cannot
    # slice with, so the graph is traced at its sizes) and compared with 0
    "written_out_causal_buffer": (reference(
        """\
        def forward(self, q, k, v):
            T = q.size(-2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))
            return F.softmax(att, dim=-1) @ v
        """, init=CAUSAL_BUFFER,
        inputs=QKV).replace("import torch\n", "import math\nimport torch\n", 1),
        "softmax(q @ k^T * scale) @ v, causal;"),
    # ReLU in place of the softmax (KernelBench L3 #50): masked keys weigh 0
    "written_out_relu_causal": (reference(
        """\
        def forward(self, q, k, v):
            att = (q @ k.mT) * 0.125
            att = att.masked_fill(self.bias[:, :, :77, :77] == 0, float('-inf'))
            return F.relu(att) @ v
        """, init=CAUSAL_BUFFER,
        inputs=QKV), "relu(q @ k^T * scale) @ v, causal;"),
    "written_out_relu": (reference(
        "def forward(self, q, k, v):\n    return torch.relu(q @ k.mT * 0.125) @ v\n", inputs=QKV),
        "relu(q @ k^T * scale) @ v;"),
    # bfloat16 through tl.dot: the interpreter needs the templates' fp32 widening (see _dot)
    "sdpa_bf16": (reference(SDPA.format(""), inputs=", ".join(["torch.randn(1, 2, 77, 64, dtype=torch.bfloat16)"] * 3)),
                  "(scaled_dot_product_attention;"),
}


@pytest.mark.parametrize("name", list(REFERENCES))
def test_generated_candidate_passes_the_real_gate(tmp_path, name):
    source, words = REFERENCES[name]
    proposal = TemplateProposer().propose(context(source))
    assert not isinstance(proposal, Decline), f"{name}: no template matched"
    assert proposal.edit.startswith("template: attention") and words in proposal.edit
    assert "\n" not in proposal.edit and proposal.parent_id is None
    assert [t.name for t in parse_tunables(proposal.source)] == ["BLOCK_M", "BLOCK_N", "num_warps",
                                                                 "num_stages", "SPLIT_MASK", "TMA"]
    dots = "ieee" if "bfloat16" in source else "tf32x3"   # half operands: plain tensor-core dots
    assert f', "{dots}")' in proposal.source and ', "tf32")' not in proposal.source
    assert_passes(gate(tmp_path, name, source, None, proposal.source))


@pytest.mark.parametrize("name", ["sdpa_bf16", "sdpa_causal_scale", "written_out_3d"])
def test_descriptor_loads_pass_the_real_gate(tmp_path, name):
    """The ``TMA`` neighbour the tuner screens first must be as correct as the seed: bf16
    through descriptors, a causal diagonal split from its whole blocks, keys longer than queries
    and a value head of its own (odd sequence lengths: the descriptors zero-fill past them)."""
    source, _ = REFERENCES[name]
    proposal = TemplateProposer().propose(context(source))
    assert not isinstance(proposal, Decline)
    assert_passes(gate(tmp_path, name, source, None, with_params(proposal.source, {"TMA": 1, "SPLIT_MASK": 1})))


SWEEP = """
import importlib.util, itertools, json, sys
import torch
import torch.nn.functional as F
spec = importlib.util.spec_from_file_location("candidate", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
causal = sys.argv[2] == "True"
gen = torch.Generator().manual_seed(1)
q, k, v = (torch.randn(2, n, 24, generator=gen) + 3.0 for n in (37, 29, 29))
want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
scale = float(want.abs().max())
errors = {"torch_fp32": float((F.scaled_dot_product_attention(q, k, v, is_causal=causal).double() - want)
                              .abs().max()) / scale}
for (block_m, block_n), split, tma in itertools.product([(16, 16), (16, 128), (128, 16), (32, 64)], (0, 1), (0, 1)):
    module.BLOCK_M, module.BLOCK_N, module.SPLIT_MASK, module.TMA = block_m, block_n, split, tma
    got = module._attention(q, k, v, 24 ** -0.5, causal)
    assert got.dtype == q.dtype and got.shape == want.shape
    errors[f"{block_m}x{block_n} split {split} tma {tma}"] = float((got.double() - want).abs().max()) / scale
# whole blocks (the unmasked path) and a negative scale (which must keep the masked one); the
# logits spread over thousands, so a wrong running max overflows exp2. Written out, not SDPA:
# torch 2.14's SDPA returns NaN for a causal mask with a negative scale.


def written_out(q, k, v, sm_scale):
    s = q @ k.mT * sm_scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


q, k, v = (torch.randn(2, 64, 32, generator=gen) * 8.0 for _ in range(3))
for sm_scale in (32 ** -0.5, -0.3):
    want = written_out(q.double(), k.double(), v.double(), sm_scale)
    torch_err = float((written_out(q, k, v, sm_scale).double() - want).abs().max()) / float(want.abs().max())
    for (block_m, block_n), split, tma in itertools.product([(16, 16), (64, 32), (32, 64)], (0, 1), (0, 1)):
        module.BLOCK_M, module.BLOCK_N, module.SPLIT_MASK, module.TMA = block_m, block_n, split, tma
        got = module._attention(q, k, v, sm_scale, causal)
        err = float((got.double() - want).abs().max()) / float(want.abs().max())
        # in units of fp32 torch's own error on these inputs
        errors[f"even {block_m}x{block_n} split {split} tma {tma} scale {sm_scale:.2f}"] = err / max(torch_err, 1e-7)
print(json.dumps(errors))
"""


@pytest.mark.parametrize("causal", [False, True])
def test_online_softmax_holds_for_every_block_shape(tmp_path, causal):
    """Block shapes the tuner may choose, each with the key loop in one masked stage and split
    into its unmasked blocks and the rest (``SPLIT_MASK``), with pointer loads and with TMA
    descriptors (zero-filled past the keys and the head dim): one key block or many, query blocks
    smaller and larger than key blocks (the causal loop bound and the diagonal), a head dim
    padded from 24 to 32, more queries than keys; then sizes in whole blocks, which take the
    unmasked path, at a positive and a negative scale (whose row max is not the scaled max of the
    raw products). Run in a subprocess: the interpreter must be on before Triton is imported."""
    found = instantiate(reference(SDPA.format(f", is_causal={causal}"),
                                  inputs="torch.randn(2, 37, 24), torch.randn(2, 29, 24), torch.randn(2, 29, 24)"))
    assert found is not None
    cand = tmp_path / "cand.py"
    cand.write_text(found.source)
    run = subprocess.run([sys.executable, "-c", SWEEP, str(cand), str(causal)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert run.returncode == 0, run.stderr
    errors = json.loads(run.stdout)
    bound = max(4 * errors["torch_fp32"], 1e-5)          # all(<): a NaN must fail, not hide in max()
    assert all(e < (4 if k.startswith("even") else bound) for k, e in errors.items()), errors


def candidate_module(source: str, path: Path) -> types.ModuleType:
    """The generated candidate imported in this process (no kernel is launched here)."""
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("attention_candidate", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sdpa_output_layout_is_pytorchs(tmp_path):
    """The gate compares strides: the port's output is laid out as PyTorch's SDPA lays out its
    own on this device (CPU flash follows the query's layout; 3-D, odd head dims and strided
    last dims take the contiguous math path)."""
    found = instantiate(reference(SDPA.format(""), inputs=QKV))
    assert found is not None
    module = candidate_module(found.source, tmp_path / "cand.py")
    base = torch.randn(2, 7, 3, 8)
    layouts = [
        (base.transpose(1, 2),) * 3,                                          # (B, S, H, D) views
        (base.permute(2, 0, 1, 3),) * 3,
        (torch.randn(2, 3, 7, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 4)),
        (torch.randn(4, 7, 8),) * 3,
        (torch.randn(2, 3, 7, 16)[..., ::2],) * 3,
        (base.transpose(1, 2).half(),) * 3,
    ]
    for q, k, v in layouts:
        want = F.scaled_dot_product_attention(q, k, v)
        got = module._sdpa_output(q, k, v, False)
        assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype)


def test_tf32_dots_only_when_the_sidecar_allows_them():
    source = REFERENCES["sdpa"][0]
    loose = TemplateProposer().propose(context(source, "tf32 = true\n"))
    assert ', "tf32")' in loose.source


@pytest.mark.parametrize("forward", [
    SDPA.format(", attn_mask=self.mask"),
    SDPA.format(", dropout_p=0.1"),
    SDPA.format(", enable_gqa=True"),
    "def forward(self, q, k, v):\n    return F.dropout(F.softmax(q @ k.mT, dim=-1), 0.1) @ v\n",
    "def forward(self, q, k, v):\n"
    "    s = (q @ k.mT).masked_fill(self.mask.triu() == 0, float('-inf'))\n"
    "    return F.softmax(s, dim=-1) @ v\n",
    "def forward(self, q, k, v):\n"
    "    s = (q @ k.mT).masked_fill(self.mask == 0, -1e4)\n"
    "    return F.softmax(s, dim=-1) @ v\n",
    # a 1×1 mask equals triu(ones(1, 1), 1) but broadcasts: it hides nothing, not the upper triangle
    "def forward(self, q, k, v):\n"
    "    s = (q @ k.mT).masked_fill(torch.zeros(1, 1, dtype=torch.bool), float('-inf'))\n"
    "    return F.softmax(s, dim=-1) @ v\n",
    "def forward(self, q, k, v):\n"
    "    return F.relu(q @ k.mT).masked_fill(self.mask == 0, float('-inf')) @ v\n",
])
def test_attention_with_a_term_the_kernel_lacks_matches_nothing(forward):
    source = reference(forward, init="self.mask = torch.ones(16, 16).tril()\n",
                       inputs="torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8)")
    declined = TemplateProposer().propose(context(source))
    assert isinstance(declined, Decline) and declined.reason.startswith(NO_MATCH), declined


def test_a_term_the_attention_kernel_lacks_is_left_to_a_pipeline_that_computes_it(tmp_path):
    """Scores scaled by ``q.sum(-1)``, a term the fused kernel has no place for: not the
    attention template, but stages that each compute what the graph says (the product, the sum
    of ``q``, the scaled softmax, the product with ``v``), which pass the gate."""
    forward = "def forward(self, q, k, v):\n    return F.softmax(q @ k.mT * q.sum(-1, keepdim=True), dim=-1) @ v\n"
    source = reference(forward, inputs="torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8)")
    found = instantiate(source)
    assert found is not None and "attention" not in found.edit and found.edit.startswith("template: pipeline of ")
    assert_passes(gate(tmp_path, "scaled_by_q_sum", source, None, found.source))


@pytest.mark.parametrize("forward", [
    "def forward(self, q, k, v):\n    return F.softmax(q @ k.mT / 8.0, dim=-2) @ v\n",
    "def forward(self, q, k, v):\n    return F.log_softmax(q @ k.mT, dim=-1) @ v\n",
])
def test_attention_like_graphs_the_kernel_lacks_run_as_a_pipeline_of_batched_products(tmp_path, forward):
    """A softmax over the queries or a log-softmax is not attention, so the attention kernel does
    not take it; a pipeline does (the batched product, the row operation, the batched product),
    and passes the gate."""
    source = reference(forward, inputs="torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8)")
    found = TemplateProposer().propose(context(source))
    assert found.edit.startswith("template: pipeline of") and "batched matmul" in found.edit, found.edit
    assert "attention_kernel" not in found.source
    assert_passes(gate(tmp_path, "pipeline", source, None, found.source))


def test_heads_wider_than_a_program_holds_are_chunked(tmp_path):
    """The flash candidate (traced at a 64-wide head) called with a 300-wide query/key head and
    a 200-wide value head: the scores are summed over 64-wide chunks of the head, the value
    columns split across programs, each recomputing the scores; the online softmax holds across
    chunks and tiles."""
    from tests.propose.template_sweep import assert_accurate, sweep

    shapes = [[1, 2, 37, 300], [1, 2, 29, 300], [1, 2, 29, 200]]
    source = reference(SDPA.format(""), inputs=QKV)
    runs = sweep(tmp_path, source, [], shapes, [{}, {"BLOCK_M": 16, "BLOCK_N": 16}])
    assert_accurate(runs)
    assert all(r.launched("attention_kernel", D_CHUNKED=True, BLOCK_D=attention.MAX_HEAD // 4) for r in runs)
    assert all(launch["grid"][1] == 2 for r in runs for launch in r.launches), "200 value columns, 128 a program"


WIDE = {
    "sdpa_fp32": (SDPA.format(""),
                  "torch.randn(1, 2, 37, 300), torch.randn(1, 2, 29, 300), torch.randn(1, 2, 29, 264)"),
    "sdpa_causal_bf16": (SDPA.format(", is_causal=True"),
                         ", ".join(["torch.randn(2, 1, 33, 272, dtype=torch.bfloat16)"] * 3)),
    "written_out": ("def forward(self, q, k, v):\n    return torch.softmax(q @ k.transpose(-2, -1) * 0.05, -1) @ v\n",
                    "torch.randn(2, 19, 320), torch.randn(2, 23, 320), torch.randn(2, 23, 40)"),
}


@pytest.mark.parametrize("name", list(WIDE))
def test_heads_wider_than_max_head_materialise_the_scores_and_pass_the_real_gate(tmp_path, name):
    """Heads wider than ``MAX_HEAD`` where the reference is traced (KernelBench L1 #97's are 1024
    wide) take the materialised candidate: batched scores with the causal mask, a row softmax,
    the product with ``v`` into the reference's output layout; it passes the real gate at odd
    sizes, in fp32 (3xTF32 dots), bf16 and the written-out form."""
    forward, inputs = WIDE[name]
    source = reference(forward, inputs=inputs)
    found = TemplateProposer().propose(context(source))
    assert f"heads wider than {attention.MAX_HEAD}" in found.edit, found.edit
    assert "attention_kernel" not in found.source
    assert_passes(gate(tmp_path, name, source, None, found.source))


def test_materialised_scores_hold_for_every_tile_the_tuner_may_pick(tmp_path):
    """The materialised candidate's tiles: K (the head, then the keys) not a multiple of the
    tile, rows of scores wider than a softmax block (walked twice), causal masking at edges;
    fp32 dots read the values packed K-major."""
    from tests.propose.template_sweep import assert_accurate, sweep

    shapes = [[1, 2, 45, 300], [1, 2, 45, 300], [1, 2, 45, 260]]
    source = reference(SDPA.format(", is_causal=True"), inputs=", ".join(f"torch.randn({s})" for s in shapes))
    settings = [{}, {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "ROW_BLOCK": 1024},
                {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4}]
    runs = sweep(tmp_path, source, [], shapes, settings)
    assert_accurate(runs)
    order = ["bmm_kernel", "softmax2_kernel", "_pack_kernel", "bmm_kernel"]   # fp32: v packed K-major
    assert all([launch["kernel"] for launch in r.launches] == order for r in runs)
    assert all(r.launched("bmm_kernel", CAUSAL=True, EVEN_K=False) for r in runs)
