"""Sandbox processes: no secrets in their environment, nothing left behind, hangs killed."""

from __future__ import annotations

import glob
import os
import tempfile
from pathlib import Path

import pytest
import torch

from kernelabd.config import Config
from kernelabd.harness.check import run_check
from kernelabd.harness.problem import load_problem
from kernelabd.harness.sandbox import head_start
from kernelabd.harness.session import Session

ROOT = Path(__file__).resolve().parents[2]
SOFTMAX = ROOT / "examples" / "softmax.py"
HONEST = (ROOT / "examples" / "softmax.new.py").read_text()

# Computes the right answer only if it cannot see the secret; otherwise returns zeros.
SNOOPING = HONEST.replace(
    "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n",
    "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
    "        import os\n"
    "        leaked = 'KERNELAB_TEST_SECRET' in os.environ or b'KERNELAB_TEST_SECRET' in "
    "open('/proc/self/environ', 'rb').read()\n"
    "        if leaked:\n"
    "            return torch.zeros_like(x)\n",
)
HANG = HONEST.replace(
    "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n",
    "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
    "        while True:\n"
    "            pass\n",
)


def gate_only(timeout_s: float = 120.0) -> Config:
    cfg = Config()
    cfg.gate.timeout_s = timeout_s
    return cfg


def test_candidate_sees_none_of_the_parents_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "KERNELAB_TEST_SECRET" in SNOOPING
    monkeypatch.setenv("KERNELAB_TEST_SECRET", "hunter2")
    cand = tmp_path / "snoop.py"
    cand.write_text(SNOOPING)
    result = run_check(SOFTMAX, cand, config=gate_only(), time_it=False)
    assert result.verdict == "pass", result.reason


def test_hang_is_killed_at_the_deadline_and_nothing_is_left_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))   # where sandboxes make their dirs
    cand = tmp_path / "hang.py"
    cand.write_text(HANG)
    result = run_check(SOFTMAX, cand, config=gate_only(timeout_s=20), time_it=False)
    assert result.verdict == "error" and result.rule == "timeout", result.reason
    assert result.wall_s is not None and result.wall_s < 40
    assert not glob.glob(str(scratch / "kernelab-*")), "sandbox working directories must be removed"
    leftover = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _our_sandbox(p)]
    assert not leftover, f"sandbox processes still running: {leftover}"


def _our_sandbox(proc: Path) -> bool:
    """A sandbox process started by this test process (other tests may run sandboxes too)."""
    try:
        ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        return ppid == os.getpid() and b"kernelabd.harness.child.server" in (proc / "cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return False


def test_head_started_sandboxes_are_the_ones_the_session_uses_and_it_closes_them() -> None:
    early = head_start("cpu", "", 0.0, ("reference", "candidate"))
    with Session(load_problem(SOFTMAX), "cpu", gate_only(), early=early) as session:
        session.open()
        result = session.evaluate(ROOT / "examples" / "softmax.new.py", time_it=False)
        assert result.verdict == "pass", result.reason
        assert session.ref_box is early["reference"]
        assert session.pending is not None and session.pending.box is early["candidate"]
    for box in early.values():
        assert box._proc is not None and box._proc.poll() is not None
        assert not box.workdir.exists()


def test_head_started_sandboxes_are_closed_when_the_check_ends_before_using_them(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("class ModelNew(:\n")
    early = head_start("cpu", "", 0.0, ("reference", "candidate"))
    result = run_check(SOFTMAX, broken, config=gate_only(), time_it=False, early=early)
    assert result.exit_code == 2 and "broken.py" in result.reason
    for box in early.values():
        assert box._proc is not None and box._proc.wait(timeout=10) is not None
        assert not box.workdir.exists()


def test_no_head_start_for_a_device_the_check_would_reject() -> None:
    assert head_start("gpu", "", 0.0, ("reference",)) == {}


def test_a_reference_that_draws_on_the_host_still_gets_its_inputs():
    """On a GPU, weights and inputs are made on the device; code that needs host tensors
    (``.numpy()`` on a fresh draw) fails there and is run again as written, from the same seed.
    The "meta" device stands in for a GPU: host-only code fails on it the same way."""
    from kernelabd.harness.child.inputs import on_device

    def host_only():
        return torch.from_numpy(torch.randn(4).numpy() * 2)

    drawn = on_device("meta", 7, host_only)
    torch.manual_seed(7)
    assert drawn.device.type == "cpu" and torch.equal(drawn, host_only()), "same seed, same draw"
    assert on_device("meta", 7, lambda: torch.randn(4)).device.type == "meta", "made on the device"
    with pytest.raises(ZeroDivisionError):
        on_device("meta", 7, lambda: 1 / 0)
