"""CUDA templates: a problem whose sidecar says ``target = "cuda"`` gets a CUDA C++ candidate
that carries its loader, declares tunables the tuner can edit, and compiles for sm_90 here."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelabd.cudalang import carried_loader, loader_text
from kernelabd.fingerprint.build import compile_cuda, cuda_programs, import_file
from kernelabd.fingerprint.sass import fingerprints
from kernelabd.harness.problem import Sidecar
from kernelabd.propose.base import Budget, JobContext, Proposal
from kernelabd.propose.template.proposer import TemplateProposer, instantiate
from kernelabd.propose.tune import apply_edit, parse_tunables
from tests.conftest import EXAMPLES

REFERENCE = (EXAMPLES / "cuda" / "softmax.py").read_text()
CUDA = Sidecar(target="cuda")


def reference(body: str) -> str:
    return REFERENCE.replace("torch.softmax(x, dim=-1)", body)


def kernels_of(source: str, tmp_path: Path) -> list:
    path = tmp_path / "cand.py"
    path.write_text(source)
    (program,) = cuda_programs(import_file(path))
    cubin, ptx, log = compile_cuda(program, "sm_90")
    return fingerprints(cubin, ptx, log, "sm_90")


@pytest.mark.parametrize(("body", "kernel"), [
    ("torch.softmax(x, dim=-1)", "row_softmax"),
    ("torch.log_softmax(x, dim=1)", "row_softmax"),
    ("torch.sum(x, dim=-1, keepdim=True)", "row_reduce"),
    ("x.mean(dim=1)", "row_reduce"),
    ("torch.amax(x, dim=-1)", "row_reduce"),
    ("torch.sigmoid(x * 2.0) + 1.0", "elementwise"),
])
def test_each_template_compiles_for_sm90(body: str, kernel: str, tmp_path: Path) -> None:
    found = instantiate(reference(body), CUDA)
    assert found is not None
    source, edit = found.source, found.edit
    assert edit.endswith(f"({kernel})")
    assert carried_loader(source) == loader_text()
    (fp,) = kernels_of(source, tmp_path)
    assert fp.name == kernel and fp.spills == 0 and fp.registers > 0


def test_the_tuners_edit_reaches_the_kernel(tmp_path: Path) -> None:
    """BLOCK is a macro: 1024 threads need 32 warps' partial results in shared memory."""
    source = instantiate(REFERENCE, CUDA).source
    (block,) = [t for t in parse_tunables(source) if t.name == "BLOCK"]
    before = kernels_of(source, tmp_path)[0]
    after = kernels_of(apply_edit(source, block, 1024), tmp_path)[0]
    assert (before.static_shared_bytes, after.static_shared_bytes) == (2 * 8 * 4, 2 * 32 * 4)


def test_what_has_no_cuda_template_gets_none() -> None:
    assert instantiate(reference("torch.softmax(x, dim=0)"), CUDA) is None       # not rows
    assert instantiate(reference("torch.softmax(x.double(), dim=-1)"), CUDA) is None
    assert instantiate(REFERENCE.replace("torch.randn(batch_size, dim)",
                                         "torch.randn(batch_size, dim).half()"), CUDA) is None


def test_the_proposer_labels_the_language() -> None:
    ctx = JobContext(job_id=1, problem="softmax", reference_source=REFERENCE, device="cpu",
                     budget=Budget(candidates_left=1, seconds_left=60.0), sidecar=CUDA)
    proposal = TemplateProposer().propose(ctx)
    assert isinstance(proposal, Proposal) and proposal.language == "cuda"
    assert proposal.params == {"BLOCK": 256}
