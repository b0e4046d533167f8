"""The matmul template's Hopper paths, in Triton's interpreter: the persistent kernel loading
through TMA tensor descriptors (the interpreter models descriptor loads and stores, zero fill
past the edges included), its pointer-load fallback where descriptors cannot address an operand,
split-K with its fixed-order sum, the descriptor store, warp specialisation, in fp32 (3xTF32),
fp16 and bf16, with epilogues and the gated MLP; each setting is held to float64 and the path it
took is read off its launches. What the interpreter cannot show (HGMMA, UTMALDG, registers) is
``bench/port/sm90.py``'s; ``test_half_gemms_compile_to_tensor_cores_and_copy_engine_loads``
reads the machine code."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from kernelabd.propose.template.proposer import TemplateProposer
from kernelabd.propose.templates import attention, conv, depthwise, elementwise, matmul, reduce, rowwise
from kernelabd.propose.tune import parse_tunables
from tests.gating import assert_passes, gate
from tests.propose.template_sweep import assert_accurate, candidate, sweep
from tests.propose.test_template import context, reference

MATMUL = "def forward(self, a, b):\n    return a @ b\n"
PATHS = [
    {},                                                                  # the seed
    {"TMA": 0},
    {"TMA": 1, "TMA_STORE": 1},
    {"TMA": 1, "SPLIT_K": 3, "BLOCK_K": 16},
    {"TMA": 1, "PERSISTENT": 0, "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16},
    {"TMA": 1, "WARP_SPECIALIZE": 1, "num_warps": 4, "GROUP_M": 1},
    {"TMA": 0, "SPLIT_K": 2, "BLOCK_K": 16, "PERSISTENT": 0},
    {"TMA": 1, "SUBTILE": 1, "TMA_STORE": 1},
    {"TMA": 0, "SUBTILE": 1},
    {"SUBTILE": 0},
]
"""The load paths and schedules a tuner may pick: descriptors or pointers, a descriptor store,
K split in three (one slice shorter than the others), one program a tile with tiles smaller than
the output, warp specialisation, the epilogue on half tiles or whole; M and N never whole
tiles."""


def mm_reference(dtype: str, m: int, k: int, n: int) -> str:
    return reference(MATMUL, inputs=f"torch.randn({m}, {k}, dtype=torch.{dtype}), "
                                    f"torch.randn({k}, {n}, dtype=torch.{dtype})")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_descriptor_and_pointer_paths_give_the_product(tmp_path, dtype):
    """``a @ b`` with B as given, (K, N) row-major: half precision reads it through an N-major
    descriptor, fp32 packs it K-major first (TF32 dots need that) and reads both K-major."""
    runs = sweep(tmp_path, mm_reference(dtype, 33, 64, 24), [], [[33, 64], [64, 24]], PATHS, dtype)
    assert_accurate(runs, dtype)
    for run in runs:
        tma = run.settings.get("TMA", matmul.start("tf32x3", dtype != "float32")["TMA"]) == 1
        assert run.launched("matmul_kernel", TMA=tma), run.settings
        assert run.launched("splitk_kernel") == (run.settings.get("SPLIT_K", 1) > 1), run.settings
    assert runs[2].launched("matmul_kernel", TMA_STORE=True)
    assert runs[5].launched("matmul_kernel", WARP_SPECIALIZE=True, FLATTEN=False)
    assert runs[7].launched("matmul_kernel", TMA_STORE=True, SUBTILE=1)
    if dtype != "float32":
        assert runs[0].launched("matmul_kernel", B_KMAJOR=False), "B read N-major, as given"


def test_linear_epilogue_holds_on_every_path_split_or_not(tmp_path):
    """``relu(x Wᵀ + b) + r · 0.5`` in bf16: the weight is K-major (a descriptor reads it so), the
    residual is read at the output's index and the bias wrapped to it, and with K split the
    epilogue runs after the partial sums, in the split-K kernel."""
    source = reference("def forward(self, x, r):\n    return torch.relu(self.fc(x)) + r * 0.5\n",
                       init="self.fc = nn.Linear(k, n, dtype=torch.bfloat16)\n", init_args=", k: int, n: int",
                       inputs=("torch.randn(2, 19, 48, dtype=torch.bfloat16), "
                               "torch.randn(2, 19, 40, dtype=torch.bfloat16)"),
                       init_values="48, 40")
    runs = sweep(tmp_path, source, [48, 40], [[2, 19, 48], [2, 19, 40]], PATHS, "bfloat16")
    assert_accurate(runs, "bfloat16")
    assert runs[0].launched("matmul_kernel", TMA=True, B_KMAJOR=True, SUBTILE=1), "operands: half tiles"
    assert runs[0].launched("matmul_kernel", t0_n=40, t1_n=0), "the bias wraps, the residual does not"
    assert runs[3].launched("splitk_kernel") and runs[3].launched("matmul_kernel", SPLIT_K=3)


def test_operands_a_descriptor_cannot_address_fall_back_to_pointers_or_pack(tmp_path):
    """K = 45 in fp16: 90-byte rows are not 16-byte aligned. Unpacked (``PACK = 0``), ``TMA = 1``
    reads them through pointers (masked in K); the seed (``PACK = 2``) pads K to 48 for this
    call only, after which descriptors apply, as they do when packing always (``PACK = 1``)."""
    runs = sweep(tmp_path, mm_reference("float16", 21, 45, 40), [], [[21, 45], [45, 40]],
                 [{"PACK": 0}, {}, {"PACK": 1, "SPLIT_K": 2, "BLOCK_K": 16}], "float16")
    assert_accurate(runs, "float16")
    assert runs[0].launched("matmul_kernel", TMA=False, EVEN_K=False)
    assert runs[1].launched("matmul_kernel", TMA=True) and runs[2].launched("splitk_kernel")


def test_a_skinny_product_splits_k_by_itself(tmp_path):
    """Few output tiles and a long K (one 16×16 tile, K = 2048): ``SPLIT_K = 0`` splits K so that
    every program works; the partials are summed in a fixed order."""
    runs = sweep(tmp_path, mm_reference("float32", 16, 2048, 16), [], [[16, 2048], [2048, 16]],
                 [{}, {"TMA": 1}], "float32")
    assert_accurate(runs)
    assert all(r.launched("splitk_kernel") and not r.launched("matmul_kernel", SPLIT_K=1) for r in runs)


def test_a_short_k_cuts_the_k_tile_to_fit(tmp_path):
    """K = 24 against the seed's 64-deep K tile (KernelBench L1 #9's K is 32): the product runs
    32-deep tiles (K rounded up to a power of two), not tiles two-thirds padding; an explicit
    ``BLOCK_K`` below K is kept as set."""
    runs = sweep(tmp_path, mm_reference("float32", 40, 24, 24), [], [[40, 24], [24, 24]],
                 [{}, {"TMA": 1, "BLOCK_K": 16}], "float32")
    assert_accurate(runs)
    assert runs[0].launched("matmul_kernel", BLOCK_K=32), runs[0].launches
    assert runs[1].launched("matmul_kernel", BLOCK_K=16), runs[1].launches


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_batch_of_products_is_one_launch_on_every_path(tmp_path, dtype):
    """``torch.bmm`` with a scalar epilogue: one launch, a product a grid row, each matrix of the
    batch read from its own base (descriptors or pointers, the output's rows odd), never split
    in K; fp32 packs both operands K-major (K = 40 padded to 48), each batch in one launch."""
    source = reference("def forward(self, a, b):\n    return torch.relu(torch.bmm(a, b)) * 2.0\n",
                       inputs=(f"torch.randn(3, 21, 40, dtype=torch.{dtype}), "
                               f"torch.randn(3, 40, 24, dtype=torch.{dtype})"))
    runs = sweep(tmp_path, source, [], [[3, 21, 40], [3, 40, 24]], PATHS, dtype)
    assert_accurate(runs, dtype)
    for run in runs:
        (launch,) = [launch for launch in run.launches if launch["kernel"] == "matmul_kernel"]
        assert launch["grid"][1] == 3 and launch["SPLIT_K"] == 1, run.settings
        packs = [launch for launch in run.launches if launch["kernel"] == "_pack_kernel"]
        assert [p["grid"][2] for p in packs] == ([3, 3] if dtype == "float32" else []), "a launch an operand"
    assert runs[2].launched("matmul_kernel", TMA=True) and runs[1].launched("matmul_kernel", TMA=False)


@pytest.mark.parametrize("forward, inputs", [
    ("torch.matmul(a, b.transpose(-1, -2))", "torch.randn(2, 2, 17, 24), torch.randn(2, 2, 30, 24)"),
    ("torch.bmm(a, b)", "torch.randn(4, 9, 33), torch.randn(4, 33, 7)"),
    ("torch.bmm(a, b)", "torch.randn(3, 5, 13, dtype=torch.float16), torch.randn(3, 13, 7, dtype=torch.float16)"),
])
def test_batched_products_pass_the_real_gate(tmp_path, forward, inputs):
    """Batched products as references write them (two batch dims, a transposed right operand
    read through its strides; KernelBench L1 #3's ``bmm`` with odd sizes; fp16 rows no
    descriptor can address, packed) pass the gate."""
    source = reference(f"def forward(self, a, b):\n    return {forward}\n", inputs=inputs)
    found = TemplateProposer().propose(context(source))
    assert "batched matmul" in found.edit, found.edit
    assert_passes(gate(tmp_path, "bmm", source, None, found.source))


MLP = ("def forward(self, x):\n    return self.w2(F.silu(self.w1(x)) * self.w3(x))\n",
       "self.w1 = nn.Linear(dim, hidden, bias=False, dtype=torch.float16)\n"
       "self.w3 = nn.Linear(dim, hidden, bias=False, dtype=torch.float16)\n"
       "self.w2 = nn.Linear(hidden, dim, bias=False, dtype=torch.float16)\n", ", dim: int, hidden: int")


def test_gated_mlp_on_descriptors_and_pointers(tmp_path):
    """fp16 gate/up with the silu-mul epilogue, then the down projection on its own tile width;
    the down projection's K (the hidden size) split too."""
    forward, init, args = MLP
    source = reference(forward, init=init, init_args=args, inputs="torch.randn(3, 11, 32, dtype=torch.float16)",
                       init_values="32, 80")
    settings = [{}, {"TMA": 0}, {"DOWN_BLOCK_N": 64, "BLOCK_N": 32, "TMA_STORE": 1},
                {"SPLIT_K": 2, "BLOCK_K": 16}, {"WARP_SPECIALIZE": 1, "num_warps": 4}]
    runs = sweep(tmp_path, source, [32, 80], [[3, 11, 32]], settings, "float16")
    assert_accurate(runs, "float16")
    assert runs[0].launched("gate_up_kernel", TMA=True) and runs[1].launched("gate_up_kernel", TMA=False)
    assert runs[3].launched("splitk_kernel") and not runs[3].launched("gate_up_kernel", SPLIT_K=2)


GATED = {
    "linear_bias_gelu_tanh_bf16": (reference(
        "def forward(self, x):\n    return F.gelu(self.fc(x), approximate='tanh')\n",
        init="self.fc = nn.Linear(k, n, dtype=torch.bfloat16)\n", init_args=", k: int, n: int",
        inputs="torch.randn(37, 64, dtype=torch.bfloat16)", init_values="64, 72"), "linear + bias + gelu_tanh"),
    "gated_mlp_fp16": (reference(MLP[0], init=MLP[1], init_args=MLP[2],
                                 inputs="torch.randn(2, 13, 48, dtype=torch.float16)", init_values="48, 96"),
                       "gated MLP"),
}


@pytest.mark.parametrize("name", list(GATED))
def test_half_precision_candidates_pass_the_real_gate(tmp_path, name):
    source, words = GATED[name]
    proposal = TemplateProposer().propose(context(source))
    assert words in proposal.edit
    assert_passes(gate(tmp_path, name, source, None, proposal.source))


def _starts(source: str) -> list[dict]:
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "STARTS":
            return ast.literal_eval(node.value)
    raise AssertionError("no STARTS")


@pytest.mark.parametrize("source", [
    mm_reference("bfloat16", 8, 16, 8), mm_reference("float32", 8, 16, 8),
    reference(MLP[0], init=MLP[1], init_args=MLP[2], inputs="torch.randn(3, 8, dtype=torch.float16)",
              init_values="8, 16"),
    reference("def forward(self, x):\n    return F.softmax(F.gelu(self.linear(x)), dim=1)\n",
              init="self.linear = nn.Linear(k, n)\n", init_args=", k: int, n: int", inputs="torch.randn(4, 8)",
              init_values="8, 6"),
    reference("def forward(self, x):\n    return torch.softmax(x, dim=-1)\n", inputs="torch.randn(4, 8)"),
    reference("def forward(self, x):\n    return x.sum(dim=1)\n", inputs="torch.randn(4, 8, 3)"),
], ids=["matmul_bf16", "matmul_fp32", "mlp_fp16", "matmul_softmax", "softmax", "sum"])
def test_known_good_starts_are_complete_configurations_of_the_declared_tunables(source):
    """``STARTS`` (what the screening batch and the tuner start from): each entry sets every
    declared tunable to one of its declared values, and the first is the seed itself."""
    generated = candidate(source)
    tunables = {t.name: t for t in parse_tunables(generated)}
    starts = _starts(generated)
    assert starts and starts[0] == {name: t.current for name, t in tunables.items()}
    for start in starts:
        assert set(start) == set(tunables), start
        assert all(value in tunables[name].values for name, value in start.items()), start


def test_every_template_declares_its_sm90_starts_per_dtype_kind():
    """The module-level ``SM90_STARTS`` the screening code reads: a list of configurations per
    kind of dots (or ``any``), each a dict over the template's tunables."""
    assert set(matmul.SM90_STARTS) == {"half", "tf32x3", "tf32", "ieee"}
    assert all(set(s) == set(matmul.TUNE_VALUES) for starts in matmul.SM90_STARTS.values() for s in starts)
    assert all(set(s) == set(rowwise.tunable_values()) for s in rowwise.SM90_STARTS["any"])
    assert all(set(s) == set(reduce.TUNE_VALUES) for s in reduce.SM90_STARTS["any"])
    for module in (attention, conv, depthwise, elementwise):
        assert all(set(s) == set(module.TUNE_VALUES) for starts in module.SM90_STARTS.values() for s in starts)


SIZED = """import torch
import torch.nn as nn

M = 64
N = 64
K = 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a @ b


def get_inputs():
    return [torch.randn(M, K, dtype=torch.{dtype}), torch.randn(K, N, dtype=torch.{dtype})]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_gemms_compile_to_tensor_cores_and_copy_engine_loads(tmp_path, dtype):
    """The seed compiled for sm_90 without a GPU (``kernelab fingerprint``'s stand-in driver) at
    1024³: its products are HGMMA (wgmma) fed by UTMALDG (TMA) copies, with nothing spilled."""
    ref, cand = tmp_path / "mm.py", tmp_path / "mm.new.py"
    ref.write_text(SIZED.format(dtype=dtype))
    (tmp_path / "mm.toml").write_text("[sizes.cuda]\nM = 1024\nN = 1024\nK = 1024\n")
    cand.write_text(candidate(ref.read_text()))
    run = subprocess.run([sys.executable, "-m", "kernelabd", "fingerprint", str(cand), "--arch", "sm_90", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    (kernel,) = [k for k in json.loads(run.stdout)["kernels"] if k["name"] == "matmul_kernel"]
    assert kernel["instructions"].get("HGMMA", 0) > 0 and kernel["instructions"].get("UTMALDG", 0) > 0, kernel
    assert kernel["spills"] == 0 and kernel["local_bytes"] == 0
