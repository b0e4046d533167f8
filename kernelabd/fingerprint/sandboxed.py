"""Fingerprint a candidate for the daemon: in a sandbox of its own, since making a fingerprint
runs the candidate's module (and its forward, compile-only) like any evaluation does."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kernelabd.harness.sandbox import Sandbox, SandboxError, SandboxSpec

TIMEOUT_S = 300.0    # a large Triton GEMM compiles in about 10 s on one core


def fingerprint_in_sandbox(reference: Path, candidate: Path, spec: SandboxSpec,
                           arch: str | None = None, timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
    """``{"arch", "kernels": [...with ptx and sass]}``, or ``{"error": one line}`` when the
    candidate could not be fingerprinted (it does not compile, launches nothing, crashed).

    The sandbox reports its own fingerprint: it informs people and proposers and decides
    nothing, so a candidate that lies about it gains nothing."""
    with Sandbox(spec) as box:
        staged_ref = box.stage_file(reference, reference.name)
        sidecar = reference.with_suffix(".toml")
        if sidecar.is_file():
            box.stage_file(sidecar, sidecar.name)
        staged = box.stage_file(candidate, f"fp_{candidate.name}")
        try:
            reply, _ = box.request({"cmd": "fingerprint", "path": staged, "reference": staged_ref,
                                    "arch": arch}, deadline=time.monotonic() + timeout_s,
                                   what="fingerprinting the candidate")
        except SandboxError as exc:
            return {"error": exc.message}
    if "error" in reply:
        return {"error": str(reply["error"]).splitlines()[0]}
    return reply
