"""The job-long reference: made once for many candidates, its seeds redrawn every so many, its
failures told with where they happened, and a candidate that writes into its inputs caught by
the trusted process (which compares the candidate's copies with the reference's)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelabd.config import Config
from kernelabd.harness.problem import load_problem
from kernelabd.harness.session import Rejected, Session
from tests.conftest import EXAMPLES

SOFTMAX = EXAMPLES / "softmax.py"
HONEST = EXAMPLES / "softmax.new.py"
MUTATES = Path(__file__).resolve().parents[1] / "adversarial" / "candidates" / "mutates_input.py"


def gate_only(reseed_every: int = 0) -> Config:
    cfg = Config()
    cfg.gate.timeout_s = 120
    cfg.gate.reseed_every = reseed_every
    return cfg


def test_the_reference_is_made_once_for_several_candidates_and_reseeded_every_n():
    with Session(load_problem(SOFTMAX), "cpu", gate_only(reseed_every=2)) as session:
        session.open()
        box, first = session.ref_box, session.ref
        seen = []
        for _ in range(3):
            result = session.evaluate(HONEST, time_it=False)
            assert result.verdict == "pass", result.reason
            seen.append(session.ref)
            assert session.ref_box is box, "one reference sandbox for the whole session"
        assert seen[0] is first and seen[1] is first, "the first two candidates share its sets"
        assert seen[2] is not first, "the third comes after the seeds were redrawn"
        assert "reference" in result.stages and "reference" not in session.evaluate(HONEST, time_it=False).stages


def test_a_candidate_writing_into_its_inputs_is_caught_by_the_trusted_side():
    with Session(load_problem(SOFTMAX), "cpu", gate_only()) as session:
        session.open()
        result = session.evaluate(MUTATES, time_it=False)
    assert result.verdict == "fail" and result.rule == "mutated_input", result.reason


def test_the_memory_plan_is_made_before_the_reference_sets(tmp_path: Path):
    with Session(load_problem(SOFTMAX), "cpu", gate_only()) as session:
        session.open()
        plan = session.plan
        assert plan is not None and plan.fits and plan.device == "cpu"
        assert plan.gate_sets == len([s for s in session.ref.sets[:session.ref.n_gate] if s.shape == 0])
        assert plan.bytes["inputs"] > 0 and plan.needs_host_bytes > 0
        peers = session.peers(["compile", "compile_max_autotune"])
    assert peers["note"] and peers["compile_ms"] is None and peers["best"] == "eager", \
        "a CPU job compiles nothing with torch.compile (a C++ build per job, times unlike a GPU's)"


ACROSS_BATCH = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x - x.mean(dim=0, keepdim=True)


def get_inputs():
    return [torch.randn(16, 64)]


def get_init_inputs():
    return []
"""


class ChunkedSession(Session):
    """A session whose plan chunks the float64 oracle in four, as a large problem's would."""

    whole_fits = True

    def plan_for(self, shapes, device):
        plan = super().plan_for(shapes, device)
        plan.oracle, plan.oracle_chunks, plan.oracle_whole_fits = "chunked", 4, self.whole_fits
        return plan


class OnlyChunksFit(ChunkedSession):
    whole_fits = False


def test_a_reference_separable_along_its_batch_keeps_its_chunked_oracle():
    with ChunkedSession(load_problem(SOFTMAX), "cpu", gate_only()) as session:
        session.open()
        assert (session.plan.oracle, session.plan.oracle_chunks) == ("chunked", 4)
        result = session.evaluate(HONEST, time_it=False)
    assert result.verdict == "pass", result.reason


def test_a_reference_not_separable_along_its_batch_gets_its_oracle_whole_where_that_fits(tmp_path: Path):
    """x - x.mean(0): a slice of the batch gives other values, so chunks would make a wrong
    oracle; where the plan has room the oracle is made whole, and the plan records that."""
    ref = tmp_path / "across.py"
    ref.write_text(ACROSS_BATCH)
    with ChunkedSession(load_problem(ref), "cpu", gate_only()) as session:
        session.open()
        assert (session.plan.oracle, session.plan.oracle_chunks) == ("whole", 1)
        for rs in session.ref.sets[:session.ref.n_gate]:
            [x], [oracle] = rs.input_tensors(), rs.oracle_tensors()
            x = x.double()
            assert torch.allclose(oracle.double(), x - x.mean(dim=0, keepdim=True), atol=1e-6)
    with OnlyChunksFit(load_problem(ref), "cpu", gate_only()) as session, pytest.raises(Rejected) as err:
        session.open()
    assert err.value.result.rule == "too_big" and "not separable" in (err.value.result.reason or "")


def test_a_reference_that_dies_says_where(tmp_path: Path):
    ref = tmp_path / "dies.py"
    source = SOFTMAX.read_text()
    line = next(ln for ln in source.splitlines() if "def forward" in ln)
    ref.write_text(source.replace(line, line + "\n        import os; os._exit(3)"))
    with Session(load_problem(ref), "cpu", gate_only()) as session, pytest.raises(Rejected) as rejected:
        session.open()
    result = rejected.value.result
    assert result.rule == "bad_reference" and str(ref) in result.reason
    assert "exited with status 3" in result.reason and "(in forward)" in result.reason, result.reason


OUT_OF_MEMORY = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 7.97 GiB. GPU 0 has a "
                                     "total capacity of 139.80 GiB of which 2.15 GiB is free.")
"""


def test_a_candidate_out_of_gpu_memory_is_its_own_failure_and_the_next_one_is_judged(tmp_path: Path):
    """What a sandbox reports when the device is full (torch's out-of-memory error, raised here
    on the CPU as a GPU raises it) is that evaluation's ``out_of_memory``, not the job's end."""
    oom = tmp_path / "oom.py"
    oom.write_text(OUT_OF_MEMORY)
    with Session(load_problem(SOFTMAX), "cpu", gate_only()) as session:
        session.open()
        failed = session.evaluate(oom, time_it=False)
        after = session.evaluate(HONEST, time_it=False)
    assert failed.verdict == "error" and failed.rule == "out_of_memory", (failed.rule, failed.reason)
    assert "CUDA out of memory" in failed.reason
    assert after.verdict == "pass", after.reason


def test_a_reseed_short_of_gpu_memory_gives_up_the_incumbents_sandbox_and_draws_again():
    """The device filled by the job's own processes when new seeds are due: the reference's
    sandbox reports the out-of-memory error of its arenas (injected here on the first reload,
    as the driver says it on a GPU); the incumbent's sandbox is closed to make room, the sets
    are drawn again, and the candidate is still judged."""
    from kernelabd.harness.sandbox import SandboxError

    with Session(load_problem(SOFTMAX), "cpu", gate_only(reseed_every=1)) as session:
        session.open()
        assert session.evaluate(HONEST, time_it=False).verdict == "pass"
        session.promote()
        held = session.incumbent
        real, calls = session.load_reference, []

        def full_once() -> None:
            calls.append(session.incumbent)
            if len(calls) == 1:
                raise SandboxError("raised", "ArenaError: out of GPU memory: an arena of 8.00 GiB does "
                                   "not fit (0.14 GiB free; cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY)")
            real()

        session.load_reference = full_once
        result = session.evaluate(HONEST, time_it=False)
    assert result.verdict == "pass", result.reason
    assert calls == [held, None], "the second draw comes after the incumbent's sandbox was given up"
    assert held is not None and held.box._closed and session.incumbent is None


def test_a_spare_sandbox_is_found_whatever_the_device_is_called():
    """``kernelab port --device cuda`` starts its spare for ``cuda:0``; the next candidate must
    take it (not start cold), and a spare for another device is left alone."""
    from types import SimpleNamespace

    from kernelabd.harness.session import take_spare

    spare = SimpleNamespace(spec=SimpleNamespace(device="cuda:0"))
    other = SimpleNamespace(spec=SimpleNamespace(device="cuda:1"))
    spares = {"candidate": spare, "other": other}
    assert take_spare(spares, "cuda") is spare and list(spares) == ["other"]
    assert take_spare(spares, "cuda:0") is None and take_spare(spares, "cpu") is None
    assert take_spare(spares, "cuda:1") is other and not spares
