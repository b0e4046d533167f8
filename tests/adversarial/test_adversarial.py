"""The gate cannot be fooled (issue 7): adversarial candidates must all be rejected with the
right reason, honest ones must all pass.

Each file under ``candidates/`` is one known way of fooling a kernel harness. Its header
comments say what the harness must answer::

    # reference: softmax                 examples/softmax.py
    # expect: unwritten_output|mismatch  rules that are right (``pass`` allows a pass verdict)
    # device: cpu                        cpu: run on CPU and on GPU; gpu: GPU only
    # timeout_s: 15                      [gate] timeout_s for this case
    # expect_timing: not_faster          must not come out faster than noise …
    # baseline: softmax.new.py           … against this example candidate

Every file under ``honest/`` declares ``# reference: NAME`` and must pass the gate; more
honest variants are generated from the examples by rewriting a module-level tunable, as the
tuner does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from kernelabd.config import Config
from kernelabd.harness.check import run_check
from kernelabd.harness.result import CheckResult

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXAMPLES = ROOT / "examples"
CANDIDATES = HERE / "candidates"
HONEST = HERE / "honest"
HEADER = re.compile(r"^#\s*([a-z_]+):\s*(.+?)\s*$")
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")

# Candidates checked through the CLI (``kernelab check --json``) rather than run_check, so that
# exit codes and the one-object-on-stdout contract are tested against hostile candidates too.
VIA_CLI = {"exit_at_import", "fake_verdict_exit", "no_modelnew", "torch_fallback"}


@dataclass
class Case:
    path: Path
    reference: Path
    expect: set[str]
    device: str = "cpu"
    timeout_s: float = 120.0
    not_faster: bool = False
    baseline: Path | None = None

    @property
    def name(self) -> str:
        return self.path.stem


def headers(path: Path) -> dict[str, str]:
    """``# key: value`` comment lines of a file (the machine-readable header)."""
    found = {}
    for line in path.read_text().splitlines():
        m = HEADER.match(line)
        if m:
            found.setdefault(m.group(1), m.group(2))
    return found


def load_case(path: Path) -> Case:
    h = headers(path)
    missing = [k for k in ("reference", "expect", "device") if k not in h]
    assert not missing, f"{path.name}: header lacks {missing}"
    assert h["device"] in ("cpu", "gpu"), f"{path.name}: device must be cpu or gpu"
    assert h.get("expect_timing", "not_faster") == "not_faster", f"{path.name}: expect_timing"
    return Case(path=path, reference=EXAMPLES / f"{h['reference']}.py",
                expect=set(h["expect"].split("|")), device=h["device"],
                timeout_s=float(h.get("timeout_s", 120)),
                not_faster="expect_timing" in h,
                baseline=EXAMPLES / h["baseline"] if "baseline" in h else None)


ADVERSARIAL = [load_case(p) for p in sorted(CANDIDATES.glob("*.py"))]


def config(timeout_s: float = 120.0) -> Config:
    """Short timing so the suite stays fast; the gate itself is unchanged."""
    cfg = Config()
    cfg.timing.budget_s = 0.5
    cfg.timing.min_pairs = 3
    cfg.gate.timeout_s = timeout_s
    return cfg


def describe(result: CheckResult) -> str:
    return (f"verdict={result.verdict} rule={result.rule} reason={result.reason!r} "
            f"faster_than_noise={result.faster_than_noise} speedup={result.speedup}")


def outcome(result: CheckResult) -> str:
    return "pass" if result.verdict == "pass" else str(result.rule)


def record(kind: str, name: str, device: str, expected: str, result: CheckResult) -> None:
    """Append the observed outcome to $ADVERSARIAL_LOG (JSON lines), for bench/ tables."""
    log = os.environ.get("ADVERSARIAL_LOG")
    if log:
        row = {"kind": kind, "case": name, "device": device, "expected": expected,
               "observed": outcome(result), "reason": result.reason,
               "faster_than_noise": result.faster_than_noise, "speedup": result.speedup,
               "wall_s": result.wall_s}
        with open(log, "a") as fh:
            fh.write(json.dumps(row) + "\n")


def suite_sized(reference: Path, device: str, tmp_path: Path) -> Path:
    """The reference as the suite runs it: on a GPU, at its small module sizes (the exploits do
    not depend on size; the sidecar's GPU sizes would make the suite take many GPU-minutes),
    unless ADVERSARIAL_GPU_SIZES=full. Extra shapes and other sidecar keys are kept."""
    sidecar = reference.with_suffix(".toml")
    if device == "cpu" or os.environ.get("ADVERSARIAL_GPU_SIZES") == "full" or not sidecar.is_file():
        return reference
    copy = tmp_path / "reference" / reference.name
    copy.parent.mkdir()
    copy.write_text(reference.read_text())
    kept, skipping = [], False
    for line in sidecar.read_text().splitlines():
        if line.startswith("["):
            skipping = line.strip().startswith("[sizes.")
        if not skipping:
            kept.append(line)
    copy.with_suffix(".toml").write_text("\n".join(kept) + "\n")
    return copy


def check_via_cli(case: Case, device: str, home: Path) -> CheckResult:
    cmd = [sys.executable, "-m", "kernelabd", "check", str(suite_sized(case.reference, device, home)),
           str(case.path), "--json",
           "--device", device, "--home", str(home), "--timeout-s", str(case.timeout_s)]
    if case.baseline is None and not case.not_faster:
        cmd.append("--no-timing")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELAB")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, f"expected one JSON line on stdout, got:\n{proc.stdout}\n{proc.stderr}"
    data = json.loads(lines[0])
    keep = {k: data[k] for k in ("verdict", "reason", "rule", "faster_than_noise", "speedup")}
    result = CheckResult(**keep)
    assert proc.returncode == result.exit_code, (proc.returncode, describe(result))
    return result


def adversarial_params() -> list:
    params = []
    for case in ADVERSARIAL:
        if case.device == "cpu":
            params.append(pytest.param(case, "cpu", id=f"{case.name}-cpu"))
        params.append(pytest.param(case, "cuda", id=f"{case.name}-cuda",
                                   marks=[pytest.mark.gpu, needs_cuda]))
    return params


@pytest.mark.parametrize(("case", "device"), adversarial_params())
def test_adversarial_candidate_is_rejected(case: Case, device: str, tmp_path: Path) -> None:
    if case.name in VIA_CLI:
        result = check_via_cli(case, device, tmp_path)
    else:
        result = run_check(suite_sized(case.reference, device, tmp_path), case.path, device=device,
                           baseline=case.baseline, config=config(case.timeout_s), time_it=True)
    record("adversarial", case.name, device, "|".join(sorted(case.expect)), result)
    assert outcome(result) in case.expect, f"{case.name}: expected {sorted(case.expect)}, got " \
        + describe(result)
    if result.verdict != "pass":
        assert result.reason, "a rejection must say why"
        assert result.exit_code == (2 if result.rule == "bad_candidate" else 1)
    if case.not_faster:
        if result.verdict == "pass":
            assert result.candidate_ms is not None, "a not_faster case must have been timed"
        assert result.faster_than_noise is False, f"{case.name}: " + describe(result)


def test_every_case_names_an_existing_reference() -> None:
    assert len(ADVERSARIAL) >= 20
    for case in ADVERSARIAL:
        assert case.reference.is_file(), case.path
        assert case.baseline is None or case.baseline.is_file(), case.path
        assert case.expect, case.path
        text = case.path.read_text()
        assert text.startswith('"""'), f"{case.path.name}: starts with its docstring"
        assert "Source:" in text.split('"""')[1], f"{case.path.name}: docstring names a source"


# ----- honest candidates: an overzealous gate is a defect too ---------------------------------

@dataclass
class Honest:
    name: str
    reference: Path
    source: str


def honest_file(path: Path) -> Honest:
    ref = headers(path).get("reference")
    assert ref, f"{path.name}: no '# reference:' header"
    return Honest(path.stem, EXAMPLES / f"{ref}.py", path.read_text())


def variant(example: str, assignments: dict[str, int]) -> Honest:
    """An example candidate with module-level tunables rewritten, as the tuner rewrites them."""
    source = (EXAMPLES / f"{example}.new.py").read_text()
    for name, value in assignments.items():
        source, n = re.subn(rf"(?m)^{name} = \d+$", f"{name} = {value}", source)
        assert n == 1, f"{example}.new.py: no single module-level '{name} = N'"
    tag = "-".join(f"{k}{v}" for k, v in assignments.items())
    return Honest(f"{example}-{tag}", EXAMPLES / f"{example}.py", source)


HONEST_CASES = [
    *(Honest(f"{name}.new", EXAMPLES / f"{name}.py", (EXAMPLES / f"{name}.new.py").read_text())
      for name in ("softmax", "layernorm", "gelu_gate")),
    *(honest_file(p) for p in sorted(HONEST.glob("*.py"))),
    variant("softmax", {"num_warps": 1}),
    variant("softmax", {"num_warps": 4}),
    variant("layernorm", {"num_warps": 2}),
    variant("layernorm", {"num_warps": 16}),
    variant("gelu_gate", {"BLOCK_SIZE": 256, "num_warps": 2}),
    variant("gelu_gate", {"BLOCK_SIZE": 4096, "num_warps": 8}),
]
# A few are also timed: the timed re-check and the trusted-clock cross-check must let them by.
TIMED_HONEST = {"softmax.new", "softmax_online", "gelu_gate-BLOCK_SIZE256-num_warps2"}


def honest_params() -> list:
    params = []
    for case in HONEST_CASES:
        params.append(pytest.param(case, "cpu", id=f"{case.name}-cpu"))
        params.append(pytest.param(case, "cuda", id=f"{case.name}-cuda",
                                   marks=[pytest.mark.gpu, needs_cuda]))
    return params


@pytest.mark.parametrize(("case", "device"), honest_params())
def test_honest_candidate_passes(case: Honest, device: str, tmp_path: Path) -> None:
    path = tmp_path / f"{case.name.replace('.', '_')}.py"
    path.write_text(case.source)
    timed = case.name in TIMED_HONEST
    result = run_check(suite_sized(case.reference, device, tmp_path), path, device=device,
                       config=config(), time_it=timed)
    record("honest", case.name, device, "pass", result)
    assert result.verdict == "pass", f"{case.name}: " + describe(result)
    assert result.exit_code == 0
    assert result.input_sets >= 4
    if timed:
        assert result.candidate_ms is not None and result.timed_sets > 0


def test_enough_honest_cases() -> None:
    assert len(HONEST_CASES) >= 20
    assert len({c.name for c in HONEST_CASES}) == len(HONEST_CASES)
