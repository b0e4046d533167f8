"""The convergence loop of one job: propose → gate → time → accept/reject → propose …

The loop keeps no state of its own between evaluations: it reads the job and its candidates
through a ``Recorder`` and writes each step back before taking the next. That is what makes
``kill -9`` harmless: a restarted job reloads the same history, re-evaluates only the candidate
that was in flight (state ``evaluating``/``pending``), and the proposers, which derive their
next move from that history, carry on where they were.
"""

from __future__ import annotations

import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kernelabd.config import Config
from kernelabd.harness.problem import ProblemError, load_problem
from kernelabd.harness.sandbox import Sandbox, SandboxSpec, head_start
from kernelabd.propose.base import (
    Budget,
    Candidate,
    Decline,
    JobContext,
    Proposal,
    Proposer,
    ProposerUnavailable,
    load_proposer,
)
from kernelabd.propose.tune import params_of

CheckFn = Callable[..., Any]          # kernelabd.harness.check.run_check's signature
Progress = Callable[[str], None]
SOL_MARGIN = 1.05                     # within 5 % of the speed-of-light floor: nothing left


class Recorder(Protocol):
    """Where the loop reads its job and writes every step (the daemon's store, directly or
    over a worker's pipe)."""

    def load(self, job_id: int) -> dict[str, Any]: ...
    def add_candidate(self, job_id: int, proposal: dict[str, Any], proposer: str) -> int: ...
    def start_candidate(self, candidate_id: int) -> None: ...
    def finish_candidate(self, job_id: int, candidate_id: int, result: dict[str, Any],
                         accepted: bool) -> None: ...
    def update_job(self, job_id: int, fields: dict[str, Any]) -> None: ...
    def add_active_time(self, job_id: int, seconds: float) -> None: ...
    def event(self, kind: str, message: str, level: str = "info",
              job_id: int | None = None) -> None: ...
    def device_ceilings(self, job_id: int) -> dict[str, Any] | None: ...
    def set_device_ceilings(self, job_id: int, ceilings: dict[str, Any]) -> bool: ...
    def add_exchange(self, job_id: int, candidate_id: int | None,
                     exchange: dict[str, Any]) -> None: ...


class ReferenceInvalid(Exception):
    """The reference cannot be evaluated; the job becomes ``invalid`` with this one line."""


@dataclass
class Outcome:
    """How a job ended: the state to record and why."""

    state: str                          # done | failed | invalid
    stop_reason: str | None = None
    error: str | None = None


@dataclass
class Limits:
    max_candidates: int
    max_minutes: float
    patience: int
    proposers: list[str] = field(default_factory=list)

    @classmethod
    def for_job(cls, job_config: dict[str, Any], config: Config, sidecar: str | None = None) -> Limits:
        """The job's own settings (fixed when it was queued: ``port --proposer``, else the
        sidecar's ``proposers``) over the daemon's defaults."""
        jobs = config.jobs
        proposers = job_config.get("proposers") or _sidecar_proposers(sidecar) or jobs.proposers
        return cls(max_candidates=int(job_config.get("max_candidates", jobs.max_candidates)),
                   max_minutes=float(job_config.get("max_minutes", jobs.max_minutes)),
                   patience=int(job_config.get("patience", jobs.patience)),
                   proposers=list(proposers))


def _sidecar_proposers(sidecar: str | None) -> list[str] | None:
    """``proposers`` of a recorded sidecar (checked when the problem was read)."""
    if not sidecar:
        return None
    try:
        value = tomllib.loads(sidecar).get("proposers")
    except tomllib.TOMLDecodeError:
        return None
    return value if isinstance(value, list) else None


def stop_reason(limits: Limits, history: list[Candidate], active_s: float,
                sol_ms: float | None, next_s: float = 0.0) -> str | None:
    """The stop rule that applies now, if any (ARCHITECTURE.md, "Acceptance and convergence").
    ``next_s`` is what the next evaluation is expected to cost: a candidate that would end past
    ``max_minutes`` is not started, so the budget is a ceiling rather than a starting line."""
    if len(history) >= limits.max_candidates:
        return f"max_candidates ({limits.max_candidates}) reached"
    if active_s >= limits.max_minutes * 60:
        return f"max_minutes ({limits.max_minutes:g}) reached"
    if active_s + next_s > limits.max_minutes * 60:
        return (f"max_minutes ({limits.max_minutes:g}) would pass during the next candidate "
                f"(~{next_s:.0f} s each, {limits.max_minutes * 60 - active_s:.0f} s left)")
    accepted = [c for c in history if c.accepted]
    if accepted:
        since = [c for c in history if c.id > accepted[-1].id and c.state == "done"]
        if len(since) >= limits.patience:
            return f"patience: {len(since)} proposals without an accepted gain"
        best_ms = accepted[-1].candidate_ms
        if sol_ms and best_ms and best_ms <= sol_ms * SOL_MARGIN:
            return f"near speed of light ({best_ms:.4g} ms vs floor {sol_ms:.4g} ms)"
    return None


def decide(result: dict[str, Any], has_incumbent: bool) -> bool:
    """Accept a candidate that passed the gate and either is the job's first verified kernel
    or beat the incumbent by more than noise (the harness's ``faster_than_noise``)."""
    if result.get("verdict") != "pass":
        return False
    return bool(result.get("faster_than_noise")) or not has_incumbent


class Loop:
    """One job's loop, bound to its recorder, harness and working directory."""

    def __init__(self, job_id: int, recorder: Recorder, *, check: CheckFn, config: Config,
                 device: str, workdir: Path, progress: Progress | None = None,
                 prestart: bool | None = None) -> None:
        self.job_id = job_id
        self.rec = recorder
        self.check = check
        self.config = config
        self.device = device
        self.workdir = workdir
        self.progress = progress or (lambda _line: None)
        state = recorder.load(job_id)
        self.job: dict[str, Any] = state["job"]
        self.history = [Candidate.from_row(r) for r in state["candidates"]]
        self.fingerprints: dict[int, dict[str, Any]] = dict(state.get("fingerprints") or {})
        self.limits = Limits.for_job(state["job_config"], config, self.job.get("sidecar"))
        self.active_s = float(self.job.get("active_s") or 0.0)
        self.reference = workdir / f"{self.job['problem_name']}.py"
        # On a GPU, the next evaluation's sandboxes start while this one runs (on a CPU they
        # would take cores from the timing).
        self.prestart = device != "cpu" if prestart is None else prestart
        self._spares: dict[str, Sandbox] = {}
        self.costs: list[float] = []      # seconds each evaluation of this run took
        self.declines: set[tuple[str, str]] = set()   # (proposer, reason) already recorded
        self._loaded: list[Proposer] = []

    # -- files ---------------------------------------------------------------------------------

    def materialise_reference(self) -> None:
        """Write the recorded reference (and sidecar) into the job's work directory: the inbox
        copy may have changed or gone since the job was queued."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.reference.write_text(self.job["source"])
        sidecar = self.reference.with_suffix(".toml")
        if self.job.get("sidecar"):
            sidecar.write_text(self.job["sidecar"])
        elif sidecar.exists():
            sidecar.unlink()

    def candidate_file(self, cand: Candidate) -> Path:
        path = self.workdir / f"cand-{cand.id}.py"
        if not path.exists() or path.read_text() != cand.source:
            path.write_text(cand.source)
        return path

    # -- steps ---------------------------------------------------------------------------------

    @property
    def incumbent(self) -> Candidate | None:
        accepted = [c for c in self.history if c.accepted]
        return accepted[-1] if accepted else None

    def context(self) -> JobContext:
        left_s = self.limits.max_minutes * 60 - self.active_s
        return JobContext(
            job_id=self.job_id, problem=self.job["problem_name"],
            reference_source=self.job["source"], device=self.device,
            budget=Budget(self.limits.max_candidates - len(self.history), left_s),
            sidecar=load_problem(self.reference).sidecar, start_source=self.job.get("start_source"),
            capture=self.job.get("capture"), history=tuple(self.history),
            fingerprints=dict(self.fingerprints))

    def record(self, proposal: Proposal, proposer: str) -> Candidate:
        data = {"source": proposal.source, "edit": proposal.edit, "parent_id": proposal.parent_id,
                "params": proposal.params, "language": proposal.language}
        cid = self.rec.add_candidate(self.job_id, data, proposer)
        cand = Candidate(id=cid, proposer=proposer, source=proposal.source,
                         parent_id=proposal.parent_id, edit=proposal.edit,
                         params=proposal.params, language=proposal.language)
        self.history.append(cand)
        for exchange in proposal.exchanges:
            self.rec.add_exchange(self.job_id, cid, exchange)
        self.rec.event("candidate.proposed", f"#{cid} by {proposer}: {proposal.edit}",
                       job_id=self.job_id)
        return cand

    def evaluate(self, cand: Candidate) -> None:
        """Gate and time one candidate against the incumbent (or the reference) and record the
        verdict; raises ``ReferenceInvalid`` when the reference itself is the problem."""
        started = time.monotonic()
        incumbent = self.incumbent
        baseline = self.candidate_file(incumbent) if incumbent is not None else None
        path = self.candidate_file(cand)
        self.rec.start_candidate(cand.id)
        self.progress(f"candidate #{cand.id} ({cand.edit or cand.proposer}): checking")
        result = self.check(self.reference, path, device=self.device, baseline=baseline,
                            config=self.config, progress=self.progress, early=self.sandboxes())
        data = result.to_json()
        if data.get("rule") == "bad_reference":
            raise ReferenceInvalid(data.get("reason") or "the reference cannot be evaluated")
        accepted = decide(data, incumbent is not None)
        self.fingerprint(cand, path, data)
        self.rec.finish_candidate(self.job_id, cand.id, data, accepted)
        if incumbent is None and data.get("reference_ms") and not self.job.get("reference_ms"):
            fields = {"reference_ms": data["reference_ms"], "reference_noise": data.get("aa_noise")}
            self.rec.update_job(self.job_id, fields)
            self.job.update(fields)
        self.replace(cand, data, accepted)
        self.costs.append(time.monotonic() - started)
        self.charge(self.costs[-1])
        self.report(cand, data, accepted)

    def fingerprint(self, cand: Candidate, path: Path, data: dict[str, Any]) -> None:
        """On a GPU, add the candidate's machine-code fingerprint to its result (the recorder
        keeps it apart). On CPU there is no machine code: candidates run in Triton's
        interpreter there, and ``kernelab fingerprint --arch`` makes one without a GPU."""
        if self.device == "cpu" or data.get("rule") == "bad_candidate":
            return
        from kernelabd.fingerprint.sandboxed import fingerprint_in_sandbox

        self.progress(f"candidate #{cand.id}: fingerprinting its machine code")
        spec = SandboxSpec.from_config(self.config.sandbox, self.device, "fingerprint")
        found = fingerprint_in_sandbox(self.reference, path, spec)
        data["fingerprint"] = found
        if "kernels" in found:
            self.fingerprints[cand.id] = {"kernels": [
                {k: v for k, v in kernel.items() if k not in ("ptx", "sass")} for kernel in found["kernels"]]}

    def next_cost(self) -> float:
        """The next evaluation's expected seconds: the longest of the last three (they vary with
        compile times and with the candidate's speed; the first is often the dearest, the
        reference's compile and the CUDA contexts being new), 0 before any."""
        return max(self.costs[-3:], default=0.0)

    def sandboxes(self) -> dict[str, Sandbox]:
        """This evaluation's sandboxes, started during the previous one, and the next one's,
        started now: each is still a fresh process used for one evaluation, but its interpreter,
        torch, CUDA context and Triton stubs come up while a candidate is being checked
        instead of on the way to the next verdict."""
        if not self.prestart:
            return {}
        ready = self._spares or self._start_spares()
        self._spares = self._start_spares()
        return ready

    def _start_spares(self) -> dict[str, Sandbox]:
        return head_start(self.device, self.config.sandbox, ("reference", "candidate", "baseline"))

    def close_spares(self) -> None:
        for box in self._spares.values():
            box.close()
        self._spares = {}

    def replace(self, cand: Candidate, data: dict[str, Any], accepted: bool) -> None:
        done = Candidate(id=cand.id, proposer=cand.proposer, source=cand.source,
                         parent_id=cand.parent_id, edit=cand.edit, params=cand.params,
                         language=cand.language, state="done", verdict=data.get("verdict"),
                         rule=data.get("rule"), reason=data.get("reason"),
                         candidate_ms=data.get("candidate_ms"), speedup=data.get("speedup"),
                         accepted=accepted, evidence=data.get("evidence"))
        self.history = [done if c.id == cand.id else c for c in self.history]

    def charge(self, seconds: float) -> None:
        self.active_s += seconds
        self.rec.add_active_time(self.job_id, seconds)

    def report(self, cand: Candidate, data: dict[str, Any], accepted: bool) -> None:
        if data.get("verdict") != "pass":
            self.rec.event("candidate.rejected",
                           f"#{cand.id} {data.get('rule')}: {data.get('reason')}",
                           level="warning", job_id=self.job_id)
            self.progress(f"candidate #{cand.id}: {data.get('verdict')} ({data.get('rule')})")
            return
        speed = _speed(data)
        kind = "candidate.accepted" if accepted else "candidate.not_faster"
        self.rec.event(kind, f"#{cand.id} {cand.edit or cand.proposer}: {speed}",
                       job_id=self.job_id)
        self.progress(f"candidate #{cand.id}: {'accepted' if accepted else 'kept out'}, {speed}")

    def proposers(self) -> list[Proposer]:
        loaded = []
        for name in self.limits.proposers:
            try:
                loaded.append(load_proposer(name, self.config))
            except ProposerUnavailable as exc:
                self.rec.event("proposer.unavailable", str(exc), level="warning",
                               job_id=self.job_id)
        return loaded

    def next_proposal(self, proposers: list[Proposer]) -> tuple[Proposal, str] | None:
        ctx = self.context()
        for proposer in proposers:
            answer = proposer.propose(ctx)
            self.record_failed(proposer)
            if isinstance(answer, Proposal):
                return answer, proposer.name
            self.note_decline(proposer.name, answer)
        return None

    def close_proposers(self) -> None:
        """Record what a proposer still holds when the job ends (an agent's answer asked ahead
        and never used), so no exchange is lost."""
        for proposer in self._loaded:
            for exchange in getattr(proposer, "close", list)():
                self.rec.add_exchange(self.job_id, None, exchange)

    def record_failed(self, proposer: Proposer) -> None:
        """Keep the exchanges of an agent's failed proposals (no usable code, not one edit, a
        timeout, an HTTP error), each with its reason, linked to no candidate."""
        for exchange in getattr(proposer, "take_failed", list)():
            self.rec.add_exchange(self.job_id, None, exchange)
            self.rec.event("proposal.failed", f"{proposer.name}: {exchange.get('error')}",
                           level="warning", job_id=self.job_id)

    def note_decline(self, proposer: str, decline: Decline) -> None:
        """A decline with a reason (the Inductor one when Inductor hands the graph to cuBLAS,
        say) is recorded once a job, so the user sees why every configured proposer did or did
        not contribute."""
        reason = decline.reason
        if reason and (proposer, reason) not in self.declines:
            self.declines.add((proposer, reason))
            self.rec.event("proposer.declined", f"{proposer}: {reason}", job_id=self.job_id)

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> Outcome:
        try:
            return self._run()
        except ReferenceInvalid as exc:
            return Outcome("invalid", error=str(exc))
        finally:
            self.close_spares()
            self.close_proposers()

    def _run(self) -> Outcome:
        self.materialise_reference()
        self.check_reference()
        self.capture()
        for cand in [c for c in self.history if c.state != "done"]:
            self.rec.event("candidate.redo", f"#{cand.id} was in flight; evaluating it again",
                           job_id=self.job_id)
            self.evaluate(cand)
        if not self.history and self.job.get("start_source"):
            start = self.job["start_source"]
            self.evaluate(self.record(Proposal(source=start, edit="starting candidate",
                                               params=params_of(start)), "start"))
        proposers = self._loaded = self.proposers()
        while True:
            reason = stop_reason(self.limits, self.history, self.active_s, self.job.get("sol_ms"),
                                 self.next_cost())
            if reason is None:
                picked = self.next_proposal(proposers)
                if picked is None:
                    reason = "exhausted: no proposer has another candidate"
            if reason is not None:
                return self.finish(reason)
            proposal, name = picked
            self.evaluate(self.record(proposal, name))

    def capture(self) -> None:
        """FLOPs, bytes moved and launch records of the reference, and the speed-of-light
        floor they give on this device, once per job."""
        if self.job.get("capture"):
            return
        from kernelabd.service.capture import capture_reference

        self.progress("capturing the reference")
        try:
            data = capture_reference(self.reference, self.device)
        except Exception as exc:  # the reference's own failure is the gate's to report
            data = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        fields: dict[str, Any] = {"capture": data}
        sol = self.speed_of_light(data) if "error" not in data else None
        if sol is not None:
            data["sol"] = sol
            fields["sol_ms"] = sol["ms"]
            self.job["sol_ms"] = sol["ms"]
        self.rec.update_job(self.job_id, fields)
        self.job["capture"] = data

    def speed_of_light(self, capture: dict[str, Any]) -> dict[str, Any] | None:
        """The job's floor from this device's ceilings, measuring them the first time."""
        from kernelabd.service.ceilings import describe, floor_ms, measure

        ceilings = self.rec.device_ceilings(self.job_id)
        if ceilings is None:
            self.progress("measuring this device's ceilings (once per device)")
            try:
                ceilings = measure(self.device)
            except Exception as exc:  # out of memory on a busy GPU: no floor, not a failure
                self.rec.event("ceilings.failed", f"{type(exc).__name__}: {exc}".splitlines()[0],
                               level="warning", job_id=self.job_id)
                return None
            kept = self.rec.set_device_ceilings(self.job_id, ceilings)
            self.rec.event("ceilings.measured", describe(ceilings)
                           + ("" if kept else " (no device row: kept with this job only)"),
                           job_id=self.job_id)
        return floor_ms(capture, ceilings, tf32=load_problem(self.reference).sidecar.tf32)

    def check_reference(self) -> None:
        """Static checks in trusted code, before any sandbox is started."""
        try:
            load_problem(self.reference)
        except ProblemError as exc:
            raise ReferenceInvalid(str(exc).replace(str(self.reference), self.reference.name)) \
                from exc

    def finish(self, reason: str) -> Outcome:
        if self.incumbent is not None:
            return Outcome("done", stop_reason=reason)
        failures = [c for c in self.history if c.verdict in ("fail", "error")]
        if failures:
            last = failures[-1]
            error = (f"no candidate passed the gate ({len(failures)} rejected; last: "
                     f"{last.rule}: {last.reason})")
        else:
            error = ("no candidate to evaluate: no starting NAME.new.py and no proposer "
                     f"({', '.join(self.limits.proposers) or 'none'}) produced one")
        return Outcome("failed", stop_reason=reason, error=_one_line(error))


def _speed(data: dict[str, Any]) -> str:
    ci = data.get("speedup_ci") or [None, None]
    if data.get("speedup") is None:
        return "not timed"
    lo, hi = (f"{v:.3f}" if v is not None else "?" for v in ci)
    versus = "reference" if data.get("baseline") == "reference" else "incumbent"
    return f"{data['speedup']:.3f}x [{lo}, {hi}] vs {versus} ({data.get('candidate_ms')} ms)"


def _one_line(text: str) -> str:
    return " ".join(text.split())[:500]
