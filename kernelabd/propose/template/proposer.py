"""The ``template`` proposer: a fused Triton template instantiated for the reference's
recognised computation (``graph``, ``match``) — a verified first port without a model endpoint.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from kernelabd.harness.problem import Sidecar
from kernelabd.propose.base import Decline, JobContext, Proposal
from kernelabd.propose.template import match
from kernelabd.propose.template.graph import trace
from kernelabd.propose.templates import common, cuda
from kernelabd.propose.tune import params_of

TF32X3 = "tf32x3"
NO_MATCH = "no template matches the reference's graph"


def _precision(sidecar: Sidecar, dtype: torch.dtype | None, exact: bool) -> str:
    """The dots' input precision. TF32 only where the problem's sidecar allows it (the gate's
    oracle does too). Without it, fp32 dots start as 3xTF32 — each operand split into a TF32
    head and a TF32 tail, three tensor-core products with fp32 accumulation, which lands within
    about the error of an fp32 GEMM (2.3–3.6e-7 normwise against 3.5e-7 for K = 3–8k, emulated
    in float64 here) at several times the FMA units' rate; ``exact`` asks for IEEE dots on the
    FMA units, the fallback when a 3xTF32 candidate fails the gate. Half-precision operands run
    on the tensor cores whatever is asked, so they keep plain IEEE dots."""
    if sidecar.tf32:
        return "tf32"
    return "ieee" if exact or dtype != torch.float32 else TF32X3


def instantiate(reference_source: str, sidecar: Sidecar | None = None,
                exact: bool = False) -> match.Match | None:
    """The first template the reference matches, or None; ``exact``: fp32 dots in IEEE
    precision rather than 3xTF32 (``_precision``)."""
    parts = common.reference_parts(reference_source)
    g = trace(reference_source)
    if parts is None or g is None or not g.known:
        return None
    sidecar = sidecar or Sidecar()
    if sidecar.target == "cuda":
        written = cuda.match(g, list(parts))
        return match.Match(*written) if written is not None else None
    found = match.find(g, list(parts), _precision(sidecar, g.dtype, exact))
    if found is not None and found.dots == TF32X3:
        return replace(found, edit=f"{found.edit}; 3xTF32 dots")
    return found


class TemplateProposer:
    """One fused template candidate per job, from scratch (no parent); a second, with IEEE
    dots, only when the first had 3xTF32 dots and did not pass."""

    name = "template"

    def propose(self, ctx: JobContext) -> Proposal | Decline:
        mine = [c for c in ctx.history if c.proposer == self.name]
        if not mine:
            found = instantiate(ctx.reference_source, ctx.sidecar)
            return _proposal(found, ctx.sidecar) if found is not None else Decline(NO_MATCH)
        if len(mine) > 1 or mine[0].verdict not in ("fail", "error"):
            return Decline()
        seed = instantiate(ctx.reference_source, ctx.sidecar)   # what the failed one was
        exact = (instantiate(ctx.reference_source, ctx.sidecar, exact=True)
                 if seed is not None and seed.dots == TF32X3 else None)
        if exact is None:
            return Decline()
        why = mine[0].rule or mine[0].verdict
        return _proposal(replace(exact, edit=f"{exact.edit}; IEEE dots (the 3xTF32 seed did not pass: {why})"),
                         ctx.sidecar)


def _proposal(found: match.Match, sidecar: Sidecar) -> Proposal:
    return Proposal(source=found.source, edit=found.edit, parent_id=None, params=params_of(found.source),
                    language=sidecar.target)
