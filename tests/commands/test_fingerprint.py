"""``kernelab fingerprint`` as a user runs it, on this machine without a GPU: CUDA C++ through
NVRTC and Triton through a compile-only launch, both for sm_90."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from kernelabd.cudalang import with_loader
from tests.conftest import EXAMPLES, KERNELAB, ROOT

CUDA_SOFTMAX = EXAMPLES / "cuda" / "softmax.new.py"


def fingerprint(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([*KERNELAB, "fingerprint", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env)


def test_cuda_candidate_for_sm90_as_json() -> None:
    done = fingerprint(str(CUDA_SOFTMAX), "--arch", "sm_90", "--json")
    assert done.returncode == 0, done.stderr
    (kernel,) = json.loads(done.stdout)["kernels"]
    assert kernel["name"] == "softmax_kernel"
    assert kernel["arch"] == "sm_90"
    assert 0 < kernel["registers"] <= 255
    assert kernel["spills"] == 0
    assert kernel["shared_bytes"] == 2 * 8 * 4        # two floats per warp of the 256 threads
    assert kernel["launch"]["block"] == [256] and kernel["launch"]["grid"] == [8192]
    mix = kernel["instructions"]
    assert mix["SHFL"] > 0 and mix["BAR"] > 0 and mix["LDG.32"] > 0 and "HGMMA" not in mix


def test_triton_candidate_and_two_files_side_by_side(tmp_path: Path) -> None:
    """The Triton softmax against the CUDA one: every differing figure is marked."""
    triton_softmax = tmp_path / "softmax.new.py"
    triton_softmax.write_text((EXAMPLES / "softmax.new.py").read_text())
    (tmp_path / "softmax.py").write_text((EXAMPLES / "softmax.py").read_text())
    (tmp_path / "softmax.toml").write_text((EXAMPLES / "softmax.toml").read_text())
    done = fingerprint(str(triton_softmax), str(CUDA_SOFTMAX))
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert rows["num_warps"].split()[1] == "8"
    assert rows["registers"].endswith("◀")
    assert "LDG.128" in rows and rows["LDG.128"].endswith("◀")   # Triton vectorised its loads


def test_a_cuda_source_that_does_not_compile_exits_1_with_the_log(tmp_path: Path) -> None:
    broken = tmp_path / "broken.new.py"
    broken.write_text(with_loader(CUDA_SOFTMAX.read_text()).replace("merge(m, s, x[c], 1.f)",
                                                                     "merge(m, s, z[c], 1.f)"))
    done = fingerprint(str(broken), "--json")
    assert done.returncode == 1
    error = json.loads(done.stdout)["error"]
    assert error.startswith(f"{broken}: NVRTC could not compile")
    assert 'identifier "z" is undefined' in error


def test_a_triton_file_without_its_reference_is_a_one_line_error(tmp_path: Path) -> None:
    lonely = tmp_path / "lonely.py"
    lonely.write_text((EXAMPLES / "softmax.new.py").read_text())
    done = fingerprint(str(lonely), "--arch", "sm_90")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: {lonely}: its Triton kernels compile when forward runs, which needs the "
        "reference (NAME.py beside NAME.new.py, or --reference)"]
