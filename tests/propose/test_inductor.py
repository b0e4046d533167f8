"""The inductor proposer: TorchInductor's Triton rewritten into a standalone ModelNew.

On this CPU-only machine the codegen subprocess uses Inductor's Triton CPU backend with a
stand-in driver, and the candidates run under the Triton interpreter, so the whole path —
compile in a subprocess, rewrite, gate — is exercised here. Captured CUDA output code
(``tests/fixtures/inductor/*.txt``, written in torch 2.11+ format) checks the rewrite of the
GPU-specific parts (device guards, streams, ``empty_strided_cuda``, extern kernels) on CPU too.
"""

from __future__ import annotations

import ast
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from kernelabd.harness.check import gate_shapes
from kernelabd.propose.base import (
    Budget,
    Candidate,
    Decline,
    JobContext,
    Proposal,
    ProposerUnavailable,
    load_proposer,
)
from kernelabd.propose.inductor import proposer as inductor
from kernelabd.propose.inductor import rewrite
from kernelabd.propose.inductor.codegen import helper_sources
from kernelabd.propose.inductor.emit import port
from kernelabd.propose.inductor.parse import Arg, Capture, Unsupported
from kernelabd.propose.inductor.proposer import InductorProposer
from kernelabd.propose.tune import Target, TuneProposer, fits, parse_tunables, resources_of
from tests.gating import assert_passes, gate
from tests.propose.test_template import sidecar_of

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "inductor"

CENTER = '''\
import torch
import torch.nn as nn

rows, cols = 64, 48


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(dim=0, keepdim=True)


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
'''
GRAPH_BREAK = CENTER.replace("return x - x.mean(dim=0, keepdim=True)",
                             "if x.sum() > 0:\n            return x\n        return -x")
LINEAR_RELU = CENTER.replace("super().__init__()", "super().__init__()\n        self.fc = nn.Linear(64, 32)") \
    .replace("return x - x.mean(dim=0, keepdim=True)", "return torch.relu(self.fc(x))")

# the constructor uses a module-level block class, a helper method and a class attribute (as
# KernelBench level 3's networks do): the port's constructor must bring all three
HELPERS = CENTER.replace("class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n",
                         "class Scale(nn.Module):\n    def __init__(self, n):\n        super().__init__()\n"
                         "        self.w = nn.Parameter(torch.randn(n))\n\n\n"
                         "class Model(nn.Module):\n    width = 48\n\n    def __init__(self):\n"
                         "        super().__init__()\n        self.scale = self._make(self.width)\n\n"
                         "    def _make(self, n):\n        return Scale(n)\n") \
    .replace("return x - x.mean(dim=0, keepdim=True)",
             "x = x * self.scale.w\n        return x - x.mean(dim=0, keepdim=True)")

# a scan: Inductor writes its combine function beside the kernel (``_triton_helper_fn_add0``);
# reversed and masked, two kernels a shape; the extra shape's rows are wide enough that Inductor
# loops over each row, carrying the running sum
SCAN = CENTER.replace("return x - x.mean(dim=0, keepdim=True)",
                      "return torch.cumsum((x * (x > 0)).flip(1), dim=1).flip(1)"
                      " + torch.cumprod(x[:, :4], dim=1).sum()")
SCAN_SIDECAR = "[[extra_shapes]]\nrows = 3\ncols = 3000\n"


def example(name: str, sidecar: bool = True) -> tuple[str, str | None]:
    side = EXAMPLES / f"{name}.toml"
    return (EXAMPLES / f"{name}.py").read_text(), side.read_text() if sidecar and side.exists() else None


def context(source: str, sidecar: str | None = None, device: str = "cpu",
            history: tuple[Candidate, ...] = ()) -> JobContext:
    return JobContext(job_id=1, problem="p", reference_source=source, device=device,
                      budget=Budget(10, 600.0), sidecar=sidecar_of(sidecar), history=history)


# name -> (reference, sidecar): every real Inductor run the CPU tests need
JOBS: dict[str, tuple[str, str | None]] = {
    "softmax": example("softmax"),                         # gate shapes 16×1000 and 7×1023
    "gelu_gate": example("gelu_gate"),                     # 32×1024 and 3×1001
    "layernorm": example("layernorm", sidecar=False),
    "layernorm_again": example("layernorm", sidecar=False),
    "layernorm_extra_shape": example("layernorm"),         # features 512 and 769
    "matmul": example("matmul", sidecar=False),
    "graph_break": (GRAPH_BREAK, None),
    "helpers": (HELPERS, None),
    "scan": (SCAN, SCAN_SIDECAR),
}


@pytest.fixture(scope="module")
def proposed() -> dict[str, tuple[Proposal | None, str | None]]:
    """Each job through the real proposer (one codegen subprocess each), two at a time: a cold
    Inductor compile takes several seconds, and CI has two cores."""
    def one(job: tuple[str, str | None]) -> tuple[Proposal | None, str | None]:
        answer = InductorProposer(on_cpu=True).propose(context(*job))
        return (answer, None) if isinstance(answer, Proposal) else (None, answer.reason)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(JOBS, pool.map(one, JOBS.values()), strict=True))
    return results


def assert_standalone(source: str) -> None:
    """What the brief forbids at run time: Inductor, torch.compile, its heuristics and streams
    (anywhere in the code; the module docstring may name them)."""
    code = source.split('"""', 2)[2]
    for word in ("torch._inductor", "torch.compile", "triton_heuristics", "triton_helpers.", "async_compile",
                 "get_raw_stream", "_DeviceGuard", "extern_kernels", "empty_strided_cuda"):
        assert word not in code, word
    assert "class ModelNew(nn.Module)" in code


# --- real Inductor, end to end on CPU ----------------------------------------------------------

# a shape no port was generated at: symbolic sizes must serve it
UNSEEN = "\n[[extra_shapes]]\nbatch_size = 5\ndim = 77\n"
UNSEEN_SCAN = "\n[[extra_shapes]]\nrows = 5\ncols = 77\n"


@pytest.mark.parametrize("name", ["softmax", "gelu_gate", "layernorm", "helpers", "scan"])
def test_generated_port_passes_the_real_gate(proposed, tmp_path, name):
    proposal, reason = proposed[name]
    assert proposal is not None, reason
    assert re.match(r"inductor: \d Triton kernel\(s\)", proposal.edit) and "\n" not in proposal.edit
    assert proposal.parent_id is None and proposal.language == "triton"
    assert_standalone(proposal.source)
    tunables = {t.name: t for t in parse_tunables(proposal.source)}
    assert any(name.startswith("num_warps") for name in tunables)
    assert proposal.params == {k: t.current for k, t in tunables.items()}
    source, sidecar = JOBS[name]
    if sidecar:                                    # its extra shape, and one never generated for
        sidecar += UNSEEN_SCAN if name == "scan" else UNSEEN
    assert_passes(gate(tmp_path, name, source, sidecar, proposal.source))


def test_the_timed_shape_runs_kernels_specialised_to_it_and_the_others_a_dynamic_copy(proposed, tmp_path):
    """torch.compile of the reference compiles its shape statically: sizes baked in, masks and
    loops it does not need dropped. The port's ``call`` is that compile's; the gate's other
    shapes (and any other) go to ``call_any``, compiled with symbolic sizes. A ``call_any``
    that raises passes at the timed shape and fails at the others: each path serves its own."""
    proposal, reason = proposed["softmax"]
    assert proposal is not None, reason
    assert "specialised to the timed shape" in proposal.edit
    src = proposal.source
    assert re.search(r"^    xnumel = 16$", src, re.M), "the specialised kernel bakes the timed shape's rows in"
    assert "def call(args, device):" in src and "def call_any(args, device):" in src
    assert not any(t.name.endswith("_any") for t in parse_tunables(src)), "only the timed kernels are tuned"
    broken = src.replace("def call_any(args, device):",
                         "def call_any(args, device):\n    raise RuntimeError('the dynamic copy ran')\n\n\n"
                         "def _unused(args, device):")
    source, sidecar = JOBS["softmax"]
    assert_passes(gate(tmp_path, "softmax", source, None, broken))
    result = gate(tmp_path, "softmax", source, sidecar, broken)
    assert result["verdict"] != "pass" and "the dynamic copy ran" in json.dumps(result)


def test_a_single_gate_shape_gets_only_the_specialised_kernels(proposed):
    proposal, reason = proposed["layernorm"]
    assert proposal is not None, reason
    assert "call_any" not in proposal.source and "def call_s1" not in proposal.source
    assert "specialised to the timed shape" in proposal.edit


def test_reductions_launch_with_explicit_blocks(proposed):
    """The timed softmax keeps its 1000-wide rows whole in registers (a persistent reduction,
    XBLOCK rows a program: tunable); the dynamic copy loops over a row with literal blocks."""
    proposal, _ = proposed["softmax"]
    assert proposal is not None
    src = proposal.source
    assert proposal.params is not None and set(proposal.params) == {"XBLOCK", "num_warps"}
    assert "grid = (triton.cdiv(xnumel, XBLOCK), 1, 1)" in src
    assert "XBLOCK=XBLOCK, num_warps=num_warps, num_stages=1)" in src
    assert re.search(r"triton_red_\w+_any\[grid\]\(.*XBLOCK=\d+, R0_BLOCK=\d+, num_warps=\d+, num_stages=\d+\)", src)
    assert "def th_max2(a, dim)" in src           # Inductor's helper, copied in and renamed


def test_generation_is_deterministic(proposed):
    first, _ = proposed["layernorm"]
    again, _ = proposed["layernorm_again"]
    assert first is not None and again is not None
    assert first.source == again.source


def test_extern_matmul_is_declined_with_its_reason(proposed):
    proposal, reason = proposed["matmul"]
    assert proposal is None
    assert reason is not None and "extern_kernels.mm" in reason and "PyTorch compute" in reason


def test_sizes_baked_differently_per_gate_shape_get_kernels_specialised_to_each_shape(proposed, tmp_path):
    """nn.LayerNorm(features) bakes ``features`` into the kernels and the gate also checks
    features = 769, so no one copy with symbolic sizes serves both shapes: each gate shape gets
    kernels specialised to it, and the port passes the gate. A shape none was generated for is
    a clear error, never kernels indexing with sizes they were not made for."""
    proposal, reason = proposed["layernorm_extra_shape"]
    assert proposal is not None, reason
    src = proposal.source
    assert "def call_s1(args, device):" in src and "call_any" not in src
    source, sidecar = JOBS["layernorm_extra_shape"]
    assert_passes(gate(tmp_path, "layernorm", source, sidecar, src))
    unseen = gate(tmp_path, "layernorm", source, f"{sidecar}\n[[extra_shapes]]\nbatch_size = 3\nfeatures = 100\n", src)
    assert unseen["verdict"] != "pass" and "generated for the gate's shapes only" in json.dumps(unseen)


def test_a_graph_break_is_declined(proposed):
    proposal, reason = proposed["graph_break"]
    assert proposal is None
    assert reason is not None and reason.startswith("torch.compile failed")


# --- the proposer's bookkeeping (no subprocess) ------------------------------------------------

def test_registered_proposes_once_per_job_and_never_retries_a_decline(monkeypatch):
    calls: list[str] = []

    def fake(source: str, device: str, shapes: list[dict[str, Any]], timeout: float = 0,
             mode: str = "default") -> dict[str, Any]:
        calls.append(device)
        return {"declined": "no"} if "decline" in source else {"source": "TUNABLES = {'a': [1, 2]}\na = 1\n",
                                                                "edit": "inductor: x"}

    monkeypatch.setattr(inductor, "run_codegen", fake)
    monkeypatch.setenv(inductor.CPU_OPT_IN, "1")
    proposer = load_proposer("inductor")
    assert isinstance(proposer, InductorProposer)
    first = proposer.propose(context("# ok"))
    assert isinstance(first, Proposal) and first.params == {"a": 1}
    assert proposer.propose(context("# decline")) == Decline("no")
    assert proposer.propose(context("# decline")) == Decline("no")
    assert calls == ["cpu", "cpu"]
    done = Candidate(id=1, proposer="inductor", source=first.source, state="done", verdict="pass")
    assert proposer.propose(context("# ok", history=(done,))) == Decline()
    assert calls == ["cpu", "cpu"]


@pytest.mark.skipif(inductor._gpu_present(), reason="this machine has a GPU")
def test_without_a_gpu_it_is_unavailable_unless_cpu_ports_are_asked_for(monkeypatch):
    monkeypatch.delenv(inductor.CPU_OPT_IN, raising=False)
    with pytest.raises(ProposerUnavailable, match="emits C\\+\\+, not Triton"):
        load_proposer("inductor")
    proposer = InductorProposer(on_cpu=True)
    proposer.on_cpu = False                      # a GPU box's proposer, given a CPU job
    declined = proposer.propose(context("# any"))
    assert isinstance(declined, Decline) and "GPU-only" in (declined.reason or "")


def test_gate_shapes_follow_the_sidecar():
    sidecar = sidecar_of(example("softmax")[1])
    assert gate_shapes(sidecar, "cpu") == [{}, {"batch_size": 7, "dim": 1023}]
    assert gate_shapes(sidecar, "cuda:1")[0] == {"batch_size": 8192, "dim": 8192}
    assert gate_shapes(sidecar_of(None), "cpu") == [{}]


# --- captured CUDA output code: the GPU rewrite, checked on CPU --------------------------------

def cuda_capture(fixture: str, args: tuple[Arg, ...]) -> Capture:
    return Capture(code=(FIXTURES / fixture).read_text(), args=args, output="tensor", n_outputs=1,
                   device="cuda:0")


CENTER_ARGS = (Arg("x.size()[0]", "int"), Arg("x.size()[1]", "int"), Arg("x", "tensor", True))


def test_cuda_output_becomes_explicit_launches(tmp_path):
    """Two kernels (an outer reduction, then a pointwise kernel): device guard, streams and
    ``empty_strided_cuda`` are gone, each kernel has its own tunables, and the port (gated here
    on CPU under the interpreter) is right at the reference's shape and an odd one."""
    p = port(cuda_capture("center_cuda.txt", CENTER_ARGS), CENTER, False, helper_sources)
    assert_standalone(p.source)
    assert p.kernels == ["triton_red_fused_mean_0", "triton_poi_fused_mean_sub_1"]
    assert set(p.defaults) == {"XBLOCK_0", "R0_BLOCK_0", "num_warps_0", "num_stages_0", "XBLOCK_1", "num_warps_1"}
    assert "launch_triton_red_fused_mean_0(arg2_1, buf0, s27, s27, s77)" in p.source
    assert "buf1 = _empty((s77, s27), (s27, 1), torch.float32, device)" in p.source
    assert_passes(gate(tmp_path, "center", CENTER, "[[extra_shapes]]\nrows = 7\ncols = 33\n", p.source))


def test_cuda_persistent_softmax_keeps_libdevice_on_gpu_and_checks_its_static_shape(tmp_path):
    reference, sidecar = example("softmax")
    p = port(cuda_capture("softmax_cuda.txt", (Arg("x", "tensor", True),)), reference, False, helper_sources)
    assert_standalone(p.source)
    assert "from triton.language.extra import libdevice" in p.source     # Inductor's own, on a GPU
    assert p.defaults == {"XBLOCK": 4, "num_warps": 4}                     # 4 × 1024 elements in registers
    assert_passes(gate(tmp_path, "softmax", reference, None, p.source))
    # this capture was static (xnumel = 16 baked in): another shape is a clear error, never wrong
    result = gate(tmp_path, "softmax", reference, sidecar, p.source)
    assert result["verdict"] != "pass" and "generated for shape" in json.dumps(result)


def test_cuda_extern_mm_is_unsupported():
    args = (Arg("self.fc.weight", "tensor"), Arg("self.fc.bias", "tensor"), Arg("x", "tensor", True))
    with pytest.raises(Unsupported, match=r"extern_kernels\.mm"):
        port(cuda_capture("linear_relu_cuda.txt", args), LINEAR_RELU, False, helper_sources)


MM_RELU = LINEAR_RELU.replace("rows, cols = 64, 48", "rows, cols = 16, 64")
MM_ARGS = (Arg("self.fc.weight", "tensor"), Arg("self.fc.bias", "tensor"), Arg("x", "tensor", True))


def test_max_autotune_template_launches_on_its_grid_with_its_warps_and_stages_tunable(tmp_path):
    """max-autotune with Triton-only GEMM backends hands the matmul (bias and relu fused) to a
    Triton template: the port launches it on the grid Inductor's wrapper computed, with the
    warps and stages autotuning chose as TUNABLES; the block sizes stay in its body."""
    p = port(cuda_capture("mm_template_cuda.txt", MM_ARGS), MM_RELU, False, helper_sources, "max-autotune")
    assert_standalone(p.source)
    assert p.kernels == ["triton_tem_fused_addmm_relu_0"]
    assert p.defaults == {"num_warps": 4, "num_stages": 2}
    assert 2 in p.tunables["num_stages"] and 8 in p.tunables["num_warps"]
    assert "launch_triton_tem_fused_addmm_relu_0(arg1_1, arg2_1, arg0_1, buf1, 1, 1, 1)" in p.source
    assert "triton_tem_fused_addmm_relu_0[(_grid_0, _grid_1, _grid_2)](in_ptr0, arg_A, arg_B, out_ptr1," in p.source
    assert p.edit.startswith("inductor: 1 Triton kernel(s) from TorchInductor max-autotune")
    assert_passes(gate(tmp_path, "mm_relu", MM_RELU, None, p.source))


def test_the_tuner_knows_each_kernels_tiles_and_never_screens_one_no_program_holds():
    """A looped reduction holds its accumulator and the tile it loads (XBLOCK × R0_BLOCK each), a
    pointwise kernel its block: declared per kernel, its own warps named, so the tuner prunes a
    tile like 16 × 4096 at 4 warps (which Triton took 47 s to compile on the H100) before any
    compile, and keeps the configurations Inductor itself launches."""
    p = port(cuda_capture("center_cuda.txt", CENTER_ARGS), CENTER, False, helper_sources)
    declared = resources_of(p.source)
    assert declared == [{"acc": [["XBLOCK_0", "R0_BLOCK_0"]] * 2, "warps": "num_warps_0"},
                        {"acc": [["XBLOCK_1"]], "warps": "num_warps_1"}]
    gpu = Target(gpu=True, elem_bytes=4)
    assert fits(p.defaults, declared, gpu)
    assert not fits({**p.defaults, "XBLOCK_0": 16, "R0_BLOCK_0": 4096, "num_warps_0": 4}, declared, gpu)
    assert fits({**p.defaults, "XBLOCK_0": 1, "R0_BLOCK_0": 4096, "num_warps_0": 8}, declared, gpu)
    assert fits({**p.defaults, "XBLOCK_1": 4096, "num_warps_1": 1}, declared, gpu), "128 elements a thread"
    assert not fits({**p.defaults, "XBLOCK_0": 64, "R0_BLOCK_0": 256, "num_warps_0": 2}, declared, gpu)
    assert not fits({**p.defaults, "num_warps_1": 3}, declared, gpu), "launch limits hold for every kernel's warps"


def test_max_autotune_choices_are_where_the_tunables_start():
    chosen = {"triton_red_fused_mean_0": {"XBLOCK": 2, "R0_BLOCK": 128, "num_warps": 8, "num_stages": 3},
              "triton_poi_fused_mean_sub_1": {"XBLOCK": 512, "num_warps": 2, "num_stages": 1}}
    capture = Capture((FIXTURES / "center_cuda.txt").read_text(), CENTER_ARGS, "tensor", 1, "cuda:0", chosen)
    p = port(capture, CENTER, False, helper_sources, "max-autotune")
    assert p.defaults == {"XBLOCK_0": 2, "R0_BLOCK_0": 128, "num_warps_0": 8, "num_stages_0": 3,
                          "XBLOCK_1": 512, "num_warps_1": 2}
    assert all(value in p.tunables[name] for name, value in p.defaults.items())


def test_max_autotune_is_declined_for_a_cpu_job():
    answer = inductor.run_codegen(CENTER, "cpu", [{}], 60, "max-autotune")
    assert answer == {"declined": "max-autotune benchmarks its choices on a GPU; there is none on a CPU job"}


def test_a_gpu_job_gets_the_default_port_then_max_autotunes(monkeypatch):
    asked: list[str] = []

    def codegen(source: str, device: str, shapes: list[dict[str, Any]], timeout: float = 0,
                mode: str = "default") -> dict[str, Any]:
        asked.append(mode)
        if "decline" in source and mode == "default":
            return {"declined": "extern mm"}
        return {"source": f"TUNABLES = {{'a': [1, 2]}}\na = 1\n# {mode}\n", "edit": f"inductor: {mode}"}

    monkeypatch.setattr(inductor, "run_codegen", codegen)
    proposer = InductorProposer(on_cpu=True)
    first = proposer.propose(context("# ok", device="cuda:0"))
    done = Candidate(id=1, proposer="inductor", source=first.source, state="done", verdict="pass")
    second = proposer.propose(context("# ok", device="cuda:0", history=(done,)))
    assert (first.edit, second.edit) == ("inductor: default", "inductor: max-autotune")
    again = Candidate(id=2, proposer="inductor", source=second.source, state="done", verdict="pass")
    assert proposer.propose(context("# ok", device="cuda:0", history=(done, again))) == Decline()
    assert asked == ["default", "max-autotune"], "each mode's codegen runs once a job"
    only = proposer.propose(context("# decline", device="cuda:0"))
    assert only.edit == "inductor: max-autotune", "a default decline does not stop max-autotune"


def test_libdevice_without_an_interpreter_equivalent_is_declined_for_cpu_jobs():
    code = (FIXTURES / "softmax_cuda.txt").read_text().replace("libdevice.exp(tmp5)", "libdevice.nextafter(tmp5, tmp5)")
    reference, _ = example("softmax")
    args = (Arg("x", "tensor", True),)
    with pytest.raises(Unsupported, match="nextafter"):
        port(Capture(code, args, "tensor", 1, "cpu"), reference, True, helper_sources)
    on_gpu = port(Capture(code, args, "tensor", 1, "cuda:0"), reference, False, helper_sources)
    assert "libdevice.nextafter" in on_gpu.source


def test_a_port_is_where_tune_continues():
    reference, _ = example("softmax")
    p = port(cuda_capture("softmax_cuda.txt", (Arg("x", "tensor", True),)), reference, False, helper_sources)
    incumbent = Candidate(id=7, proposer="inductor", source=p.source, state="done", verdict="pass",
                          params=dict(p.defaults), accepted=True)
    step = TuneProposer().propose(context(reference, history=(incumbent,)))
    assert isinstance(step, Proposal) and step.parent_id == 7
    assert step.edit == "XBLOCK 4 → 8"
    changed = [a for a, b in zip(p.source.splitlines(), step.source.splitlines(), strict=True) if a != b]
    assert changed == ["XBLOCK = 4"]


# --- on a GPU -----------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["softmax", "gelu_gate"])
def test_on_a_gpu_the_port_of_real_inductor_output_passes_the_gate(tmp_path, name):
    source, sidecar = example(name)
    proposal = InductorProposer().propose(context(source, sidecar, device="cuda:0"))
    assert isinstance(proposal, Proposal), proposal
    assert_standalone(proposal.source)
    result = gate(tmp_path, name, source, sidecar, proposal.source, device="cuda")
    assert result["verdict"] == "pass", (result["rule"], result["reason"])



@pytest.mark.parametrize(("call", "expected"), [
    ("assert_size_stride_grouped((a), ((s0, 8)), ((8, 1)), 'op')", "_check_layout(a, (s0, 8), (8, 1))"),
    ("assert_size_stride_grouped((a, b), ((s0, 8), (8,)), ((8, 1), (1,)), 'op')",
     "(_check_layout(a, (s0, 8), (8, 1)), _check_layout(b, (8,), (1,)))"),
])
def test_grouped_layout_assertions_of_newer_inductor_become_one_check_per_input(call, expected):
    """torch ≥ 2.14 groups the input assertions; torch 2.11 (the GPU image) does not."""
    node = ast.parse(call, mode="eval").body
    assert ast.unparse(rewrite._ungroup_layout_checks(node)) == expected
