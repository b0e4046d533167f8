"""The job-long reference: made once for many candidates, its seeds redrawn every so many, its
failures told with where they happened, and a candidate that writes into its inputs caught by
the trusted process (which compares the candidate's copies with the reference's)."""

from __future__ import annotations

from pathlib import Path

import pytest

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
