"""The interface every proposer implements, and the registry that finds them by name.

A proposer is asked for one candidate at a time, with the whole history in hand, instead of
being a long-lived generator: its state is then exactly what the database holds, so a job
resumed after ``kill -9`` (or on another worker) continues the same search without repeating
or skipping anything.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernelabd.harness.problem import Sidecar
from store.fingerprints import KernelPrint, differences

# name -> "module:Class"; a name missing here or failing to import is skipped with an event.
REGISTRY: dict[str, str] = {
    "template": "kernelabd.propose.template.proposer:TemplateProposer",
    "inductor": "kernelabd.propose.inductor.proposer:InductorProposer",
    "tune": "kernelabd.propose.tune:TuneProposer",
}


@dataclass(frozen=True)
class Proposal:
    """One candidate to evaluate: its source, its parent, and the single edit that made it."""

    source: str
    edit: str                                  # one line: "BLOCK_SIZE 256 → 512" or a reason
    parent_id: int | None = None
    params: dict[str, Any] | None = None       # declared tunables' values in ``source``
    language: str = "triton"
    exchanges: tuple[dict[str, Any], ...] = ()  # an agent's exchanges that produced it


@dataclass(frozen=True)
class Batch:
    """Many configurations of one kernel to screen instead of one candidate to evaluate.

    ``source`` declares ``TUNABLES``; each configuration gives some of them values (the rest
    keep the source's). The loop screens them all, together with the parent's own configuration
    as the control, and hands only the few that beat it on to the full gate and A/B, each as an
    ordinary candidate whose edit names its change from the parent: a batch is a search, what is
    accepted is still one named change to the incumbent."""

    source: str
    configs: tuple[dict[str, Any], ...]
    parent_id: int
    language: str = "triton"


@dataclass(frozen=True)
class Decline:
    """A proposer's "nothing more for this history". ``reason`` (one line) is for the user when
    the proposer could have helped but cannot (Inductor hands the graph to cuBLAS, no template
    matches); the loop records it once a job. ``None``: simply done, nothing worth saying."""

    reason: str | None = None


@dataclass(frozen=True)
class Candidate:
    """A recorded candidate as proposers see it (a row of ``candidates``)."""

    id: int
    proposer: str
    source: str
    parent_id: int | None = None
    edit: str | None = None
    params: dict[str, Any] | None = None
    language: str = "triton"
    state: str = "pending"                     # pending | evaluating | done
    verdict: str | None = None                 # pass | fail | error
    rule: str | None = None
    reason: str | None = None
    candidate_ms: float | None = None
    speedup: float | None = None
    accepted: bool = False
    evidence: dict[str, Any] | None = None     # the gate's evidence of a failure

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Candidate:
        params = row.get("params")
        return cls(id=row["id"], proposer=row["proposer"], source=row["source"],
                   parent_id=row.get("parent_id"), edit=row.get("edit"),
                   params=json.loads(params) if isinstance(params, str) else params,
                   language=row.get("language") or "triton", state=row.get("state") or "pending",
                   verdict=row.get("verdict"), rule=row.get("rule"), reason=row.get("reason"),
                   candidate_ms=row.get("candidate_ms"), speedup=row.get("speedup"),
                   accepted=bool(row.get("accepted")), evidence=_evidence(row.get("result")))


def _evidence(result: Any) -> dict[str, Any] | None:
    data = json.loads(result) if isinstance(result, str) else result
    evidence = data.get("evidence") if isinstance(data, dict) else None
    return evidence if isinstance(evidence, dict) else None


@dataclass(frozen=True)
class Screened:
    """A screened configuration as proposers see it (a row of ``screened``): its time orders
    configurations within a job and is never a result."""

    id: int
    parent_id: int | None
    params: dict[str, Any]
    status: str                                # timed | spills | too_big | failed | wrong
    ms: float | None = None
    candidate_id: int | None = None            # set when it went on to the full gate

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Screened:
        params = row["params"]
        return cls(id=row["id"], parent_id=row.get("parent_id"),
                   params=json.loads(params) if isinstance(params, str) else dict(params),
                   status=row["status"], ms=row.get("ms"), candidate_id=row.get("candidate_id"))


@dataclass(frozen=True)
class Budget:
    candidates_left: int
    seconds_left: float


@dataclass(frozen=True)
class JobContext:
    """Everything a proposer may use to pick the next edit."""

    job_id: int
    problem: str                               # the problem's name (file stem)
    reference_source: str
    device: str
    budget: Budget
    sidecar: Sidecar = field(default_factory=Sidecar)   # parsed ``NAME.toml`` (defaults if none)
    start_source: str | None = None
    capture: dict[str, Any] | None = None
    history: tuple[Candidate, ...] = field(default_factory=tuple)
    # candidate id -> its machine-code fingerprint, {"kernels": [...]} as ``kernelab fingerprint
    # --json`` prints it; only candidates evaluated on a GPU have one
    fingerprints: dict[int, dict[str, Any]] = field(default_factory=dict)
    # the job's screened configurations, in order: what a model-based tuner learns from
    screened: tuple[Screened, ...] = ()
    # the per-device cache's best configurations for the incumbent's kernel, exact matches
    # (same kernel source, same sizes) first: {"params", "ms", "exact", "signature", "shapes"}
    cached: tuple[dict[str, Any], ...] = ()
    # configurations a ``Batch`` may hold here; 0 where this job cannot screen (a CUDA C++
    # target, or a caller without a screening sandbox): propose single candidates then
    screen_batch: int = 0

    @property
    def incumbent(self) -> Candidate | None:
        """The candidate to beat: the latest accepted one."""
        accepted = [c for c in self.history if c.accepted]
        return accepted[-1] if accepted else None

    def fingerprint_difference(self, candidate_id: int) -> list[dict[str, Any]]:
        """How a candidate's machine code differs from the incumbent's, figure by figure
        (``{"kernel", "figure", "a": incumbent's, "b": candidate's}``: registers, spills, shared
        memory, tensor-core instructions…); [] when either has no fingerprint."""
        incumbent = self.incumbent
        if incumbent is None or incumbent.id not in self.fingerprints or candidate_id not in self.fingerprints:
            return []
        a, b = (self.fingerprints[i]["kernels"] for i in (incumbent.id, candidate_id))
        return differences([KernelPrint.from_json(k) for k in a], [KernelPrint.from_json(k) for k in b])


class Proposer(Protocol):
    """Proposes candidates for a job, one single-edit candidate (or one batch to screen) per
    call."""

    name: str

    def propose(self, ctx: JobContext) -> Proposal | Batch | Decline:
        """The next candidate to evaluate, a ``Batch`` of configurations to screen (only where
        ``ctx.screen_batch`` allows one), or a ``Decline`` when this proposer has nothing more
        to offer for this history (the loop then asks the next proposer)."""
        ...


def prepare(proposer: Proposer, ctx: JobContext) -> None:
    """A proposer's optional ``prepare(ctx)``: work it can start in the background when the job
    starts, before the reference's session is open (``ctx`` then has no capture and no history),
    so that its first ``propose`` does not wait for it. A proposer without one needs none."""
    start = getattr(proposer, "prepare", None)
    if start is not None:
        start(ctx)


class ProposerUnavailable(RuntimeError):
    """The named proposer does not exist or cannot run here; the message says why."""


AGENT_PREFIX = "agents."     # "agents.NAME": the [agents.NAME] table of kernelab.toml


def load_proposer(name: str, config: Any = None) -> Proposer:
    """Instantiate a proposer by name; raises ``ProposerUnavailable`` with a one-line cause.
    ``config`` (a ``kernelabd.config.Config``) is where ``agents.NAME`` proposers are defined."""
    if name.startswith(AGENT_PREFIX):
        from kernelabd.propose.agent import AgentProposer

        return AgentProposer.configured(name, config)
    target = REGISTRY.get(name)
    if target is None:
        raise ProposerUnavailable(f"unknown proposer {name!r} (known: {', '.join(REGISTRY)}, "
                                  f"{AGENT_PREFIX}NAME)")
    module_name, attr = target.split(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ProposerUnavailable(f"proposer {name!r} is not available: {exc}") from exc
    return cls()
