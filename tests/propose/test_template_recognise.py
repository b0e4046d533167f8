"""The template proposer runs the reference only in its recognition subprocess: a reference
that hangs, exits or crashes at import or in forward is a recorded decline naming what happened,
within the deadline, and the proposer goes on; the subprocess sees a scrubbed environment; and
KernelBench's real sizes are traced on the meta device, not allocated."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kernelabd.harness.problem import Sidecar
from kernelabd.propose.base import Decline, Proposal
from kernelabd.propose.isolated import run_json
from kernelabd.propose.template.proposer import NO_MATCH, TemplateProposer, recognise
from tests.propose.test_template import context, reference

SUITE = Path(__file__).resolve().parents[2] / "bench" / "coverage" / "kernelbench"
SOFTMAX = "def forward(self, x):\n    return torch.softmax(x, dim=-1)\n"


def with_prelude(prelude: str, forward: str = SOFTMAX) -> str:
    return "import os, signal, time\n" + prelude + "\n" + reference(forward, inputs="torch.randn(4, 8)")


@pytest.mark.parametrize(("prelude", "forward", "said"), [
    ("os._exit(3)", SOFTMAX, "exited with status 3"),
    ("import sys\nsys.exit(4)", SOFTMAX, "exited with status 4"),
    ("", "def forward(self, x):\n    os.kill(os.getpid(), signal.SIGSEGV)\n", "killed by SIGSEGV"),
    ("raise RuntimeError('broken at import')", SOFTMAX, "RuntimeError: broken at import"),
])
def test_a_reference_that_dies_is_a_decline_saying_how(prelude, forward, said):
    proposal = TemplateProposer().propose(context(with_prelude(prelude, forward)))
    assert isinstance(proposal, Decline) and said in proposal.reason, proposal


def test_a_reference_that_hangs_at_import_is_killed_at_the_deadline():
    start = time.monotonic()
    answer = recognise(with_prelude("time.sleep(3600)"), Sidecar(), "cpu", timeout=20)
    assert time.monotonic() - start < 40
    assert answer["declined"] == ("template recognition of the reference did not finish within 20 s "
                                  "(loading, building and tracing the reference); killed")


def test_a_decline_is_not_asked_again_within_the_job():
    proposer = TemplateProposer()
    source = with_prelude("os._exit(3)")
    first = proposer.propose(context(source))
    start = time.monotonic()
    assert proposer.propose(context(source)) == first and time.monotonic() - start < 1


def test_the_reference_sees_a_scrubbed_environment(monkeypatch):
    monkeypatch.setenv("KERNELAB_TEST_SECRET", "hunter2")
    source = with_prelude("raise RuntimeError('secret=' + os.environ.get('KERNELAB_TEST_SECRET', 'absent') "
                          "+ ' home=' + os.environ['HOME'])")
    proposal = TemplateProposer().propose(context(source))
    assert "secret=absent" in proposal.reason and "home=/" in proposal.reason and "kernelab-propose-" in proposal.reason


def test_kernelbench_sizes_are_traced_without_allocating_them():
    """KernelBench's softmax is 4096 × 393216 fp32 (6 GiB): traced on meta tensors in seconds."""
    proposal = TemplateProposer().propose(context((SUITE / "level1" / "23_Softmax.py").read_text()))
    assert isinstance(proposal, Proposal) and proposal.edit.startswith("template: softmax")


def test_an_unknown_op_is_named_in_the_decline():
    answer = recognise((SUITE / "level1" / "89_cumsum.py").read_text(), Sidecar(), "cpu")
    assert answer["declined"] == f"{NO_MATCH}: torch.cumsum (cumsum) is an op no template knows"
    assert answer["unknown"] == ["torch.cumsum (cumsum)"]


def test_a_module_that_does_not_exist_is_an_answer_not_an_exception():
    answer = run_json("kernelabd.no_such_module", {}, timeout=60, what="the test's subprocess")
    assert answer["declined"].startswith("the test's subprocess exited with status 1: ")
    assert "No module named kernelabd.no_such_module" in answer["declined"]
