"""One check: gate a candidate against the float64 oracle, then time it against a baseline.

``kernelab check`` is a session (``session``) used once: the reference sandbox makes the inputs,
weights, its outputs and the oracle; the candidate sandbox gets fresh copies of its inputs and
weights, never an expected output; this process, which runs no evaluated code, compares, times
and decides. The daemon's jobs use the same session for all their candidates.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from kernelabd.config import Config
from kernelabd.harness.problem import ProblemError, load_candidate, load_problem
from kernelabd.harness.result import CheckResult
from kernelabd.harness.sandbox import Sandbox, canonical_device
from kernelabd.harness.session import GPU_ONLY_TARGETS, Progress, Rejected, Session, gate_shapes, needs_gpu

__all__ = ["gate_shapes", "normalise_device", "refused", "run_check"]


def normalise_device(device: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N``; raises ``ProblemError`` when that device is absent."""
    name = canonical_device(device)
    if name is None:
        raise ProblemError(f"--device {device!r}: expected cpu, cuda or cuda:N")
    if name == "cpu":
        return name
    count = torch.cuda.device_count()
    index = int(name[5:])
    if count == 0:
        raise ProblemError(f"--device {device}: no CUDA device is visible on this machine")
    if index >= count:
        raise ProblemError(f"--device {device}: only {count} CUDA device(s) visible")
    return name


def run_check(reference: Path | str, candidate: Path | str, *, device: str = "cpu",
              baseline: Path | str | None = None, config: Config | None = None,
              progress: Progress | None = None, time_it: bool = True,
              early: dict[str, Sandbox] | None = None) -> CheckResult:
    """Gate ``candidate`` against ``reference`` and, if it passes, time it against ``baseline``.

    ``baseline`` is another candidate file (the incumbent); None times against the reference.
    ``early``: sandboxes started by ``sandbox.head_start``; the check uses or closes them.
    Never raises for bad input: a file that cannot be evaluated gives rule ``bad_reference`` /
    ``bad_candidate`` (``result.exit_code == 2``).
    """
    t0 = time.monotonic()
    config = config or Config()
    result = refused(reference, candidate, baseline, device)
    if result is not None:
        for box in (early or {}).values():
            box.close()
    else:
        device = normalise_device(device)
        problem = load_problem(reference)
        with Session(problem, device, config, progress, early) as session:
            try:
                session.open()
            except Rejected as rej:
                result = rej.result
                result.stages = {"reference": round(session.reference_s, 3)}
            else:
                result = session.evaluate(Path(candidate), Path(baseline) if baseline else None, time_it)
    result.wall_s = round(time.monotonic() - t0, 3)
    return result


def refused(reference: Path | str, candidate: Path | str, baseline: Path | str | None,
            device: str) -> CheckResult | None:
    """What static checks alone refuse, before any sandbox runs: the device, the files."""
    try:
        name = normalise_device(device)
    except ProblemError as exc:
        return CheckResult.invalid("bad_arguments", str(exc), device)
    try:
        problem = load_problem(reference)
    except ProblemError as exc:
        return CheckResult.invalid("bad_reference", str(exc), name)
    if problem.sidecar.target in GPU_ONLY_TARGETS and name == "cpu":
        return CheckResult.invalid("bad_arguments", needs_gpu(problem, Path(candidate)), name)
    try:
        for path in (candidate, baseline):
            if path is not None:
                load_candidate(path)
    except ProblemError as exc:
        return CheckResult.invalid("bad_candidate", str(exc), name)
    return None
