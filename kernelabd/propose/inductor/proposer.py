"""The ``inductor`` proposer: runs the codegen subprocess once per job and hands its port to
the loop, or declines with its reason."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from kernelabd.harness.check import gate_shapes
from kernelabd.propose.base import Decline, JobContext, Proposal, ProposerUnavailable
from kernelabd.propose.tune import params_of

log = logging.getLogger("kernelab.propose.inductor")

CPU_OPT_IN = "KERNELAB_INDUCTOR_ON_CPU"   # "1": port CPU jobs too (Triton CPU backend, for tests)
CPU_UNAVAILABLE = ("without a CUDA GPU TorchInductor emits C++, not Triton, so the inductor proposer is "
                   f"GPU-only; set {CPU_OPT_IN}=1 to port CPU jobs through Inductor's Triton CPU backend "
                   "(checked under the Triton interpreter: for tests, not for performance)")
CODEGEN_TIMEOUT_S = 300.0        # one subprocess, every gate shape; a cold Inductor takes ~10 s
ROOT = Path(__file__).resolve().parents[3]


def run_codegen(source: str, device: str, shapes: list[dict[str, Any]],
                timeout: float = CODEGEN_TIMEOUT_S) -> dict[str, Any]:
    """``generate`` in a fresh subprocess with a private Inductor cache; never raises."""
    with tempfile.TemporaryDirectory(prefix="kernelab-inductor-") as tmp:
        out = Path(tmp) / "answer.json"
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env.update(TORCHINDUCTOR_CACHE_DIR=str(Path(tmp) / "cache"), TORCHINDUCTOR_COMPILE_THREADS="1",
                   PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]))
        request = json.dumps({"source": source, "device": device, "shapes": shapes, "out": str(out)})
        try:
            proc = subprocess.run([sys.executable, "-m", "kernelabd.propose.inductor.codegen"], input=request,
                                  capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp)
        except subprocess.TimeoutExpired:
            return {"declined": f"Inductor code generation took longer than {timeout:.0f} s"}
        if not out.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()
            return {"declined": f"Inductor code generation failed (exit {proc.returncode}): "
                                f"{tail[-1] if tail else 'no output'}"[:500]}
        return json.loads(out.read_text())


def _gpu_present() -> bool:
    """Whether an NVIDIA GPU is visible, asked through NVML: unlike ``torch.cuda``, it does not
    initialise CUDA in the worker, which forks sandboxes."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    try:
        return int(pynvml.nvmlDeviceGetCount()) > 0
    except Exception:
        return False
    finally:
        pynvml.nvmlShutdown()


class InductorProposer:
    """One Inductor port per job, from scratch (no parent); a ``Decline`` with the reason when
    the reference's graph cannot be ported.

    GPU-only unless ``on_cpu`` (or ``KERNELAB_INDUCTOR_ON_CPU=1``): on a machine without a GPU
    loading it raises ``ProposerUnavailable``, and a CPU job on a GPU box is declined.
    """

    name = "inductor"

    def __init__(self, on_cpu: bool | None = None) -> None:
        self.on_cpu = os.environ.get(CPU_OPT_IN) == "1" if on_cpu is None else on_cpu
        if not self.on_cpu and not _gpu_present():
            raise ProposerUnavailable(f"proposer 'inductor' is not available: {CPU_UNAVAILABLE}")
        self._answers: dict[str, dict[str, Any]] = {}

    def propose(self, ctx: JobContext) -> Proposal | Decline:
        if any(c.proposer == self.name for c in ctx.history):
            return Decline()
        device = ctx.device
        if device == "cpu" and not self.on_cpu:
            return Decline(CPU_UNAVAILABLE)
        shapes = gate_shapes(ctx.sidecar, device)
        key = hashlib.sha256("\0".join([ctx.reference_source, json.dumps(shapes, sort_keys=True), device])
                             .encode()).hexdigest()
        answer = self._answers.get(key)
        if answer is None:
            timeout = max(30.0, min(CODEGEN_TIMEOUT_S, ctx.budget.seconds_left))
            answer = run_codegen(ctx.reference_source, device, shapes, timeout)
            self._answers[key] = answer      # a decline is not retried every loop iteration
            if "declined" in answer:
                log.info("proposer.declined", extra={"proposer": self.name, "job": ctx.job_id,
                                                      "reason": answer["declined"]})
        if "declined" in answer:
            return Decline(answer["declined"])
        return Proposal(source=answer["source"], edit=answer["edit"], parent_id=None,
                        params=params_of(answer["source"]))
