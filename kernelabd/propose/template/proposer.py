"""The ``template`` proposer: a fused Triton template instantiated for the reference's
recognised computation (``graph``, ``match``) — a verified first port without a model endpoint.

Recognition loads and runs the reference, which is untrusted code, so the proposer does it in
the recognition subprocess (``recognise``) under a deadline; this module's ``attempt`` is what
that process runs. ``instantiate`` runs it in the calling process, for trusted callers (tests,
benchmarks) only.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from kernelabd.harness.problem import Sidecar
from kernelabd.propose.base import Decline, JobContext, Proposal
from kernelabd.propose.isolated import run_json
from kernelabd.propose.template import match, pipeline
from kernelabd.propose.template.graph import Graph, NotRecognised, trace
from kernelabd.propose.templates import common, cuda
from kernelabd.propose.tune import params_of
from kernelabd.pysource import parse

log = logging.getLogger("kernelab.propose.template")

TF32X3 = "tf32x3"
NO_MATCH = "no template matches the reference's graph"
RECOGNISE_TIMEOUT_S = 120.0
"""One recognition subprocess a job: torch's import and a meta-device trace take seconds; a
reference that cannot run on meta tensors is run on the CPU at its own sizes, within this."""


@dataclass(frozen=True)
class Miss:
    """Why no template applies: one line, the ops no template knows (``nn.BatchNorm2d (bn)``,
    in graph order) and the canonical kinds of the graph's ops."""

    reason: str
    unknown: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)


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


DEFAULT_INIT = "def __init__(self):\n    super().__init__()\n"
"""The constructor of a ``Model`` that defines none (nn.Module's, which takes no arguments)."""


def _reference_parts(source: str) -> tuple[list[str], str] | None:
    """The reference's imports and ``Model.__init__`` source (``common.reference_parts``), with
    ``DEFAULT_INIT`` for a ``Model`` class that has no ``__init__`` of its own."""
    parts = common.reference_parts(source)
    if parts is not None:
        return parts
    tree = parse(source)
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    if model is None or model.decorator_list or any(
            isinstance(n, ast.FunctionDef) and n.name == "__init__" for n in model.body):
        return None
    imports = [ast.get_source_segment(source, n) or "" for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    return [i for i in imports if i], DEFAULT_INIT


def recognise_graph(source: str, constants: dict[str, Any] | None = None,
                    phase: Callable[[str], None] | None = None) -> Graph | Miss:
    """The reference's canonical graph, or why there is none (runs the reference)."""
    (phase or (lambda _: None))("loading, building and tracing the reference")
    try:
        g = trace(source, constants)
    except NotRecognised as exc:
        return Miss(f"{NO_MATCH}: {exc}")
    if not g.known and not g.cuttable:
        return Miss(f"{NO_MATCH}: {g.unknown[0]} is an op no template knows", g.unknown,
                    [op.kind for op in g.ops])
    return g


def match_graph(g: Graph, source: str, sidecar: Sidecar, exact: bool = False,
                plan: tuple[Graph, ...] = ()) -> match.Match | Miss:
    """The first template the graph matches; ``exact``: fp32 dots in IEEE precision rather than
    3xTF32 (``_precision``); ``plan``: the stages of a pipeline an earlier match found, tried
    before searching again."""
    kinds = [op.kind for op in g.ops]
    parts = _reference_parts(source)
    if parts is None:
        return Miss(f"{NO_MATCH}: the reference's Model.__init__ cannot be copied (missing or decorated)",
                    kinds=kinds)
    if (why := g.widest_output()) is not None:
        return Miss(f"{NO_MATCH}: {why}", kinds=kinds)
    if sidecar.target == "cuda":
        written = cuda.match(g, list(parts)) if g.known else None
        found = match.as_returned(g, match.Match(*written)) if written is not None else None
    else:
        precision = _precision(sidecar, g.dtype, exact)
        def whole(part: Graph) -> match.Match | None:
            return match.find(part, list(parts), precision)
        stages = (pipeline.rematch(plan, whole) if plan else None) or pipeline.find(g, whole)
        found = None if stages is None else stages[0][1] if len(stages) == 1 else \
            pipeline.compose(stages, g.signature)
        if found is not None and found.dots == TF32X3:
            found = replace(found, edit=f"{found.edit}; 3xTF32 dots")
    if found is None and not g.known:
        return Miss(f"{NO_MATCH}: {g.unknown[0]} is an op no template knows", g.unknown, kinds)
    if found is None:
        return Miss(f"{NO_MATCH}: every op is known, but no template has this graph's shape "
                    f"({' → '.join(kinds) or 'no ops'})", kinds=kinds)
    return found


def attempt(source: str, sidecar: Sidecar | None = None, exact: bool = False,
            constants: dict[str, Any] | None = None,
            phase: Callable[[str], None] | None = None) -> match.Match | Miss:
    """The first template the reference matches at the sizes ``constants`` set, or why none
    does. Runs the reference in this process."""
    g = recognise_graph(source, constants, phase)
    return g if isinstance(g, Miss) else match_graph(g, source, sidecar or Sidecar(), exact)


def instantiate(reference_source: str, sidecar: Sidecar | None = None, exact: bool = False,
                constants: dict[str, Any] | None = None) -> match.Match | None:
    """``attempt``'s template, or None: for trusted callers (tests, benchmarks), since it runs
    the reference in this process."""
    found = attempt(reference_source, sidecar, exact, constants)
    return found if isinstance(found, match.Match) else None


def recognise(source: str, sidecar: Sidecar, device: str, timeout: float = RECOGNISE_TIMEOUT_S) -> dict[str, Any]:
    """The recognition subprocess's answer for a job (``recognise`` module): never raises."""
    request = {"source": source, "constants": sidecar.constants_for(device), "target": sidecar.target,
               "tf32": sidecar.tf32}
    answer = run_json("kernelabd.propose.template.recognise", request, timeout=timeout,
                      what="template recognition of the reference")
    if "seed" not in answer and "declined" not in answer:
        return {"declined": "template recognition answered neither a match nor a reason"}
    return answer


class TemplateProposer:
    """One fused template candidate per job, from scratch (no parent); a second, with IEEE
    dots, only when the first had 3xTF32 dots and did not pass. Recognition runs once a job, in
    a subprocess, started by ``prepare`` when the job starts; its answer (or its decline) is
    kept for the job's later calls."""

    name = "template"

    def __init__(self) -> None:
        self._answers: dict[str, dict[str, Any]] = {}
        self._pending: dict[str, threading.Thread] = {}

    @staticmethod
    def _key(ctx: JobContext) -> str:
        side = ctx.sidecar
        return hashlib.sha256("\0".join([ctx.reference_source, ctx.device, side.target, str(side.tf32),
                                         json.dumps(side.constants_for(ctx.device), sort_keys=True)])
                              .encode()).hexdigest()

    def prepare(self, ctx: JobContext) -> None:
        """Start recognition in the background: it needs only the reference's source (traced on
        the meta device), so it runs while the loop opens the reference's session instead of
        after it, and the first proposal finds its answer."""
        key = self._key(ctx)
        if key in self._answers or key in self._pending:
            return
        thread = threading.Thread(target=self._recognise, args=(key, ctx), name="kernelab-recognise", daemon=True)
        self._pending[key] = thread
        thread.start()

    def close(self) -> list[dict[str, Any]]:
        """Wait for a recognition still running (bounded by its deadline): nothing this
        proposer started outlives the job. It holds no exchanges."""
        for thread in self._pending.values():
            thread.join()
        self._pending.clear()
        return []

    def _recognise(self, key: str, ctx: JobContext) -> None:
        timeout = max(10.0, min(RECOGNISE_TIMEOUT_S, ctx.budget.seconds_left))
        self._answers[key] = recognise(ctx.reference_source, ctx.sidecar, ctx.device, timeout)
        if "declined" in self._answers[key]:
            log.info("proposer.declined", extra={"proposer": self.name, "job": ctx.job_id,
                                                  "reason": self._answers[key]["declined"]})

    def _answer(self, ctx: JobContext) -> dict[str, Any]:
        key = self._key(ctx)
        pending = self._pending.pop(key, None)
        if pending is not None:
            pending.join()
        if key not in self._answers:
            self._recognise(key, ctx)
        return self._answers[key]

    def propose(self, ctx: JobContext) -> Proposal | Decline:
        mine = [c for c in ctx.history if c.proposer == self.name]
        if len(mine) > 1 or (mine and mine[0].verdict not in ("fail", "error")):
            return Decline()
        answer = self._answer(ctx)
        if "declined" in answer:
            return Decline(str(answer["declined"])) if not mine else Decline()
        if not mine:
            return _proposal(answer["seed"], ctx.sidecar)
        exact = answer.get("exact")
        if not exact:
            return Decline()
        why = mine[0].rule or mine[0].verdict
        return _proposal({**exact, "edit": f"{exact['edit']}; IEEE dots (the 3xTF32 seed did not pass: {why})"},
                         ctx.sidecar)


def _proposal(found: dict[str, Any], sidecar: Sidecar) -> Proposal:
    source, edit = str(found["source"]), str(found["edit"])
    return Proposal(source=source, edit=edit, parent_id=None, params=params_of(source), language=sidecar.target)
