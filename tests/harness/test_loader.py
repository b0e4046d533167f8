"""Malformed references: one line naming the file and the cause, exit 2, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNELAB = str(Path(sys.executable).with_name("kernelab"))
CANDIDATE = ROOT / "examples" / "softmax.new.py"

HEADER = "import torch\nimport torch.nn as nn\n"
GOOD_MODEL = """
class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)
"""
GOOD_INPUTS = """
def get_inputs():
    return [torch.randn(4, 64)]

def get_init_inputs():
    return []
"""


def model_returning(expr: str) -> str:
    return f"""
class Model(nn.Module):
    def forward(self, x):
        return {expr}
"""


CASES = {
    "syntax": (HEADER + "def broken(:\n", "syntax error"),
    "missing": (HEADER + GOOD_MODEL, "missing get_inputs, get_init_inputs"),
    "inputs_raise": (HEADER + GOOD_MODEL + "\ndef get_inputs():\n    raise ValueError('no data')\n"
                     "\ndef get_init_inputs():\n    return []\n", "ValueError: no data"),
    "not_tensor": (HEADER + model_returning("3.0") + GOOD_INPUTS, "returned float; expected tensors"),
    "empty": (HEADER + model_returning("x[:0]") + GOOD_INPUTS, "empty tensor"),
    # bounded whatever the input: on the gate's scaled variant (offsets of 100-200 σ, stretched
    # up to 10×) x * 1e-9 passes 1e-6 whenever stretch × offset passes 1000, and failed a run
    "near_zero": (HEADER + model_returning("torch.tanh(x) * 1e-9") + GOOD_INPUTS, "near zero everywhere"),
    "constant": (HEADER + model_returning("torch.ones_like(x)") + GOOD_INPUTS,
                 "identical for different inputs"),
    "init_raises": (HEADER + GOOD_MODEL + "\ndef get_inputs():\n    return [torch.randn(2, 2)]\n"
                    "\ndef get_init_inputs():\n    return 1 / 0\n", "ZeroDivisionError"),
}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KERNELAB, "check", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_reference_is_one_line_exit_2(case: str, tmp_path: Path) -> None:
    source, cause = CASES[case]
    ref = tmp_path / f"{case}.py"
    ref.write_text(source)
    proc = run(str(ref), str(CANDIDATE), "--no-timing")
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    text = " ".join(ln.strip() for ln in lines)
    assert str(ref) in text and cause in text
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    source, _ = CASES["inputs_raise"]
    ref = tmp_path / "raises.py"
    ref.write_text(source)
    proc = run(str(ref), str(CANDIDATE), "--no-timing", "--debug")
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr and "get_inputs" in proc.stderr


def test_json_for_bad_reference(tmp_path: Path) -> None:
    ref = tmp_path / "bad.py"
    ref.write_text(CASES["missing"][0])
    proc = run(str(ref), str(CANDIDATE), "--json")
    assert proc.returncode == 2
    out = json.loads(proc.stdout)
    assert out["verdict"] == "error" and out["rule"] == "bad_reference"
    assert "missing" in out["reason"]


@pytest.mark.parametrize("sidecar,cause", [
    ("tolerence = 1e-3\n", "unknown key(s): tolerence"),
    ("tf32 = 'yes'\n", "tf32 must be true or false, got 'yes'"),
    ("variants = ['base', 'weird']\n", "variants must be"),
    ("[sizes\n", "TOMLDecodeError"),
])
def test_bad_sidecar(sidecar: str, cause: str, tmp_path: Path) -> None:
    ref = tmp_path / "softmax.py"
    ref.write_text((ROOT / "examples" / "softmax.py").read_text())
    (tmp_path / "softmax.toml").write_text(sidecar)
    proc = run(str(ref), str(CANDIDATE), "--no-timing")
    assert proc.returncode == 2
    assert "softmax.toml" in proc.stderr and cause in proc.stderr


@pytest.mark.parametrize("args,cause", [
    (["--device", "tpu"], "expected cpu, cuda or cuda:N"),
    (["--timeout-s", "-1"], "--timeout-s must be positive"),
])
def test_bad_arguments(args: list[str], cause: str) -> None:
    proc = run(str(ROOT / "examples" / "softmax.py"), str(CANDIDATE), *args, "--json")
    assert proc.returncode == 2
    assert cause in json.loads(proc.stdout)["reason"]


def test_missing_candidate_file() -> None:
    proc = run(str(ROOT / "examples" / "softmax.py"), "/nonexistent/cand.py")
    assert proc.returncode == 2 and "/nonexistent/cand.py: no such file" in proc.stderr
