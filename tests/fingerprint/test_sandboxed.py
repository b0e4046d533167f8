"""The daemon fingerprints a candidate in a sandbox of its own; a CUDA candidate needs no GPU
for it (NVRTC), so this runs here."""

from __future__ import annotations

from pathlib import Path

from kernelabd.cudalang import with_loader
from kernelabd.fingerprint.sandboxed import fingerprint_in_sandbox
from kernelabd.harness.sandbox import SandboxSpec
from tests.conftest import EXAMPLES

SPEC = SandboxSpec(device="cpu", label="fingerprint")


def test_a_cuda_candidate_in_a_sandbox(tmp_path: Path) -> None:
    reference = tmp_path / "softmax.py"     # no sidecar: the module's own (small) sizes
    reference.write_text((EXAMPLES / "cuda" / "softmax.py").read_text())
    candidate = tmp_path / "cand-7.py"
    candidate.write_text((EXAMPLES / "cuda" / "softmax.new.py").read_text())
    found = fingerprint_in_sandbox(reference, candidate, SPEC, arch="sm_90")
    (kernel,) = found["kernels"]
    assert found["arch"] == "sm_90"
    assert kernel["name"] == "softmax_kernel" and kernel["launch"]["grid"] == [16]
    assert "SHFL" in kernel["sass"] and ".target sm_90" in kernel["ptx"]

    broken = tmp_path / "cand-8.py"
    broken.write_text(with_loader(candidate.read_text()).replace("x[c], 1.f", "z[c], 1.f"))
    assert fingerprint_in_sandbox(reference, broken, SPEC, arch="sm_90") == {
        "error": "the CUDA source does not compile: candidate.cu(19): error: identifier \"z\" is undefined"}
