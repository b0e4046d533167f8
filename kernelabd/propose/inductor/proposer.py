"""The ``inductor`` proposer: runs the codegen subprocess once per job and hands its port to
the loop, or declines with its reason."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any

from kernelabd.harness import nvml
from kernelabd.harness.check import gate_shapes
from kernelabd.propose.base import Decline, JobContext, Proposal, ProposerUnavailable
from kernelabd.propose.inductor.codegen import DEFAULT, MODES
from kernelabd.propose.isolated import run_json
from kernelabd.propose.tune import params_of

log = logging.getLogger("kernelab.propose.inductor")

CPU_OPT_IN = "KERNELAB_INDUCTOR_ON_CPU"   # "1": port CPU jobs too (Triton CPU backend, for tests)
CPU_UNAVAILABLE = ("without a CUDA GPU TorchInductor emits C++, not Triton, so the inductor proposer is "
                   f"GPU-only; set {CPU_OPT_IN}=1 to port CPU jobs through Inductor's Triton CPU backend "
                   "(checked under the Triton interpreter: for tests, not for performance)")
CODEGEN_TIMEOUT_S = 300.0        # one subprocess, every gate shape; a cold Inductor takes ~10 s


def run_codegen(source: str, device: str, shapes: list[dict[str, Any]], timeout: float = CODEGEN_TIMEOUT_S,
                mode: str = DEFAULT) -> dict[str, Any]:
    """``generate`` in a fresh subprocess (scrubbed environment, a private Inductor cache, the
    job's GPU visible on a GPU job) under ``timeout``; never raises."""
    request = {"source": source, "device": device, "shapes": shapes, "mode": mode}
    return run_json("kernelabd.propose.inductor.codegen", request, timeout=timeout,
                    what=f"Inductor code generation ({mode})", gpu=device.startswith("cuda"),
                    env={"TORCHINDUCTOR_CACHE_DIR": "{HOME}/inductor-cache", "TRITON_CACHE_DIR": "{HOME}/triton-cache"})


def _gpu_present() -> bool:
    """Whether an NVIDIA GPU is visible, asked through NVML: unlike ``torch.cuda``, it does not
    initialise CUDA in the worker, which forks sandboxes."""
    try:
        with nvml.opened() as pynvml:
            return int(pynvml.nvmlDeviceGetCount()) > 0
    except Exception:   # no NVML, or a driver that cannot count its GPUs: no GPU to use
        return False


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

    def modes(self, device: str) -> tuple[str, ...]:
        """The compile modes a job gets a port from, in order: the default one, then on a GPU
        max-autotune's (Triton GEMM templates, autotuned launch configurations)."""
        return MODES if device.startswith("cuda") else (DEFAULT,)

    def propose(self, ctx: JobContext) -> Proposal | Decline:
        proposed = {c.source for c in ctx.history if c.proposer == self.name}
        if ctx.device == "cpu" and not self.on_cpu:
            return Decline(CPU_UNAVAILABLE) if not proposed else Decline()
        reasons = []
        for mode in self.modes(ctx.device):
            answer = self._answer(ctx, mode)
            if "declined" in answer:
                reasons.append(answer["declined"] if mode == DEFAULT else f"{mode}: {answer['declined']}")
            elif answer["source"] not in proposed:
                return Proposal(source=answer["source"], edit=answer["edit"], parent_id=None,
                                params=params_of(answer["source"]))
        return Decline("; ".join(reasons)) if reasons and not proposed else Decline()

    def _answer(self, ctx: JobContext, mode: str) -> dict[str, Any]:
        """The codegen subprocess's answer for this job and mode, asked once (a decline too)."""
        shapes = gate_shapes(ctx.sidecar, ctx.device)
        key = hashlib.sha256("\0".join([ctx.reference_source, json.dumps(shapes, sort_keys=True), ctx.device,
                                        mode]).encode()).hexdigest()
        if key not in self._answers:
            timeout = max(30.0, min(CODEGEN_TIMEOUT_S, ctx.budget.seconds_left))
            self._answers[key] = run_codegen(ctx.reference_source, ctx.device, shapes, timeout, mode)
            if "declined" in self._answers[key]:
                log.info("proposer.declined", extra={"proposer": self.name, "job": ctx.job_id, "mode": mode,
                                                      "reason": self._answers[key]["declined"]})
        return self._answers[key]
