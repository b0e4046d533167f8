"""Sandbox processes: no secrets in their environment, nothing left behind, hangs killed."""

from __future__ import annotations

import glob
import os
import tempfile
from pathlib import Path

import pytest

from kernelabd.check import run_check
from kernelabd.config import Config

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
        return ppid == os.getpid() and b"kernelabd.sandbox_child" in (proc / "cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return False
