"""CUDA C++ as a target: the sidecar selects it, a compile error is a failure of rule
``compile`` with the log as evidence, a CPU check says it needs a GPU, and on a GPU the
example is gated and timed like a Triton candidate."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from kernelabd.cudalang.loader import CompileError
from kernelabd.harness.check import run_check
from kernelabd.harness.child.server import error_reply
from kernelabd.harness.problem import load_problem
from kernelabd.harness.sandbox import SandboxError
from kernelabd.harness.session import sandbox_failure
from tests.conftest import EXAMPLES, KERNELAB, ROOT

REFERENCE, CANDIDATE = EXAMPLES / "cuda" / "softmax.py", EXAMPLES / "cuda" / "softmax.new.py"
LOG = ('candidate.cu(12): error: identifier "z" is undefined\n'
       "1 error detected in the compilation of candidate.cu.\n")


def test_the_sidecar_selects_cuda() -> None:
    assert load_problem(REFERENCE).sidecar.target == "cuda"


def test_a_compile_error_fails_rule_compile_with_the_log_as_evidence() -> None:
    try:
        raise CompileError(LOG)
    except CompileError as exc:
        reply = error_reply(exc, "load_candidate")
    assert reply["rule"] == "compile"
    assert reply["error"] == ('the CUDA source does not compile: candidate.cu(12): error: '
                              'identifier "z" is undefined')
    assert reply["evidence"] == {"log": LOG}
    failure = SandboxError("raised", reply["error"], rule=reply["rule"], evidence=reply["evidence"])
    result = sandbox_failure(failure, "candidate", "cuda:0")
    assert (result.verdict, result.rule, result.exit_code) == ("fail", "compile", 1)
    assert result.evidence["log"] == LOG


def test_a_cuda_check_on_cpu_says_it_needs_a_gpu() -> None:
    done = subprocess.run([*KERNELAB, "check", str(REFERENCE), str(CANDIDATE), "--json"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2
    result = json.loads(done.stdout)
    assert result["rule"] == "bad_arguments"
    assert result["reason"] == (
        f"{CANDIDATE}: target 'cuda' (set in {REFERENCE.with_suffix('.toml')}) compiles and "
        "launches CUDA C++ kernels, which need a GPU; this check runs on cpu (use --device cuda)")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_cuda_example_is_gated_and_timed_on_a_gpu() -> None:
    result = run_check(REFERENCE, CANDIDATE, device="cuda")
    assert result.verdict == "pass", result.reason
    assert result.candidate_ms and result.reference_ms and result.speedup
    assert result.clock is not None
