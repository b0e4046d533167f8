"""The convergence loop of one job: propose → gate → time → accept/reject → propose …

The loop keeps no state of its own between evaluations: it reads the job and its candidates
through a ``Recorder`` and writes each step back before taking the next. That is what makes
``kill -9`` harmless: a restarted job reloads the same history, re-evaluates only the candidate
that was in flight (state ``evaluating``/``pending``), and the proposers, which derive their
next move from that history, carry on where they were.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kernelabd.config import Config
from kernelabd.harness.problem import (
    Problem,
    ProblemError,
    load_problem,
    parse_sidecar,
    validate_candidate,
)
from kernelabd.harness.result import CheckResult
from kernelabd.harness.sandbox import Sandbox, SandboxSpec
from kernelabd.harness.session import Rejected, Session
from kernelabd.propose.base import (
    Batch,
    Budget,
    Candidate,
    Decline,
    JobContext,
    Proposal,
    Proposer,
    ProposerUnavailable,
    load_proposer,
    prepare,
)
from kernelabd.propose.tune import params_of

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
    def add_fingerprint(self, candidate_id: int, found: dict[str, Any], seconds: float) -> None: ...
    def update_job(self, job_id: int, fields: dict[str, Any]) -> None: ...
    def add_active_time(self, job_id: int, seconds: float) -> None: ...
    def event(self, kind: str, message: str, level: str = "info",
              job_id: int | None = None) -> None: ...
    def ceilings(self, key: str) -> dict[str, Any] | None: ...
    def keep_ceilings(self, job_id: int, key: str, ceilings: dict[str, Any]) -> None: ...
    def screened(self, job_id: int) -> list[dict[str, Any]]: ...
    def add_screened(self, job_id: int, rows: list[dict[str, Any]]) -> list[int]: ...
    def link_screened(self, screened_id: int, candidate_id: int) -> None: ...
    def cached_configs(self, device_name: str, signature: str, family: str,
                       shapes: str) -> list[dict[str, Any]]: ...
    def cache_best(self, entry: dict[str, Any]) -> bool: ...
    def add_exchange(self, job_id: int, candidate_id: int | None,
                     exchange: dict[str, Any]) -> None: ...


# Results that mean the reference, not the candidate, cannot be evaluated.
REFERENCE_RULES = frozenset({"bad_reference", "too_big"})


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
    """``proposers`` of a recorded sidecar, parsed as every sidecar is (it was checked when the
    problem was read; a sidecar that no longer parses names none)."""
    if not sidecar:
        return None
    try:
        return parse_sidecar(sidecar, "NAME.toml").proposers
    except ProblemError:
        return None


def stop_reason(limits: Limits, history: list[Candidate], active_s: float,
                sol_ms: float | None, next_s: float = 0.0, peer_speedup: float = 1.0) -> str | None:
    """The stop rule that applies now, if any (ARCHITECTURE.md, "Acceptance and convergence").
    ``next_s`` is what the next evaluation is expected to cost: a candidate that would end past
    ``max_minutes`` is not started, so the budget is a ceiling rather than a starting line.
    ``peer_speedup`` is the best torch.compile mode's speedup over eager: near the speed of light
    is no reason to stop while the job is still behind it."""
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
        ahead = math.prod(c.speedup or 1.0 for c in accepted) >= peer_speedup
        if sol_ms and best_ms and best_ms <= sol_ms * SOL_MARGIN and ahead:
            return f"near speed of light ({best_ms:.4g} ms vs floor {sol_ms:.4g} ms)"
    return None


def best_peer_speedup(peers: dict[str, Any] | str | None) -> float:
    """The best torch.compile mode's measured speedup over eager (1.0 when none beat it)."""
    if isinstance(peers, str):
        peers = json.loads(peers)
    if not peers:
        return 1.0
    return max([1.0, *(v for k, v in peers.items() if k.endswith("_speedup") and isinstance(v, int | float))])


FINGERPRINTS_IN_FLIGHT = 2
"""Machine-code fingerprints made at once, each beside an evaluation in a sandbox of its own. One
took 6.4-11.3 s on an H200 against 2.4-8.7 s for the gate and the A/B (bench/screen, 2026-12-04),
so the loop goes on without it and records it when it ends; a third waits for the oldest, which
bounds the processes (and host memory) they hold."""


def decide(result: dict[str, Any], has_incumbent: bool) -> bool:
    """Accept a candidate that passed the gate and either is the job's first verified kernel
    or beat the incumbent by more than noise (the harness's ``faster_than_noise``)."""
    if result.get("verdict") != "pass":
        return False
    return bool(result.get("faster_than_noise")) or not has_incumbent


class Loop:
    """One job's loop, bound to its recorder, harness and working directory."""

    def __init__(self, job_id: int, recorder: Recorder, *, config: Config,
                 device: str, workdir: Path, progress: Progress | None = None,
                 prestart: bool | None = None) -> None:
        self.job_id = job_id
        self.rec = recorder
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
        # On a GPU, the next evaluation's sandbox starts while this one runs (on a CPU it
        # would take cores from the timing).
        self.prestart = device != "cpu" if prestart is None else prestart
        self.session: Session | None = None
        self.costs: list[float] = []      # seconds each evaluation of this run took
        self.declines: set[tuple[str, str]] = set()   # (proposer, reason) already recorded
        self._loaded: list[Proposer] = []
        self._prints: list[tuple[int, threading.Thread, dict[str, Any]]] = []   # fingerprints being made

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

    @functools.cached_property
    def problem(self) -> Problem:
        """The job's reference as parsed once: the source is fixed for the job, and every loop
        iteration asks for its sidecar (a parse of a large reference is not free)."""
        return load_problem(self.reference)

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
        from kernelabd.service.screening import search_context

        left_s = self.limits.max_minutes * 60 - self.active_s
        return search_context(self, JobContext(
            job_id=self.job_id, problem=self.job["problem_name"],
            reference_source=self.job["source"], device=self.device,
            budget=Budget(self.limits.max_candidates - len(self.history), left_s),
            sidecar=self.problem.sidecar, start_source=self.job.get("start_source"),
            capture=self.job.get("capture"), history=tuple(self.history),
            fingerprints=dict(self.fingerprints)))

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

    def evaluate(self, cand: Candidate, compiled_in: Sandbox | None = None) -> None:
        """Gate and time one candidate against the incumbent (or the reference) and record the
        verdict; raises ``ReferenceInvalid`` when the reference itself is the problem.
        ``compiled_in``: the sandbox that compiled this very source (``Session.evaluate``)."""
        assert self.session is not None
        started = time.monotonic()
        incumbent = self.incumbent
        baseline = self.candidate_file(incumbent) if incumbent is not None else None
        path = self.candidate_file(cand)
        self.rec.start_candidate(cand.id)
        self.progress(f"candidate #{cand.id} ({cand.edit or cand.proposer}): checking")
        self.collect_fingerprints(at_most=FINGERPRINTS_IN_FLIGHT - 1)
        fingerprinting = self.start_fingerprint(path)
        result = self.session.evaluate(path, baseline, compiled_in=compiled_in)
        data = result.to_json()
        if data.get("rule") in REFERENCE_RULES:
            raise ReferenceInvalid(data.get("reason") or "the reference cannot be evaluated")
        accepted = decide(data, incumbent is not None)
        if accepted:
            self.session.promote()
        self.rec.finish_candidate(self.job_id, cand.id, data, accepted)
        if fingerprinting is not None and data.get("rule") != "bad_candidate":
            self._prints.append((cand.id, *fingerprinting))
        if incumbent is None and data.get("reference_ms") and not self.job.get("reference_ms"):
            fields = {"reference_ms": data["reference_ms"], "reference_noise": data.get("aa_noise")}
            self.rec.update_job(self.job_id, fields)
            self.job.update(fields)
        self.replace(cand, data, accepted)
        self.costs.append(time.monotonic() - started)
        self.charge(self.costs[-1])
        self.report(cand, data, accepted)

    def start_fingerprint(self, path: Path) -> tuple[threading.Thread, dict[str, Any]] | None:
        """On a GPU, the candidate's machine-code fingerprint, made in a sandbox of its own
        (compiling on the host's cores) while the device gates and times it; the loop records it
        when it ends (``collect_fingerprints``). On CPU candidates run in Triton's interpreter and
        have no machine code: a CPU job makes one for ``[search] cpu_arch`` where that is set (as
        ``kernelab fingerprint --arch`` does without a GPU), and none otherwise."""
        arch = (self.config.search.cpu_arch or None) if self.device == "cpu" else None
        if self.device == "cpu" and arch is None:
            return None
        from kernelabd.fingerprint.sandboxed import fingerprint_in_sandbox

        spec = dataclasses.replace(SandboxSpec.from_config(self.config.sandbox, self.device, "fingerprint"),
                                   interpret=False)
        found: dict[str, Any] = {}

        def run() -> None:
            t0 = time.monotonic()
            found.update(fingerprint_in_sandbox(self.reference, path, spec, arch=arch))
            found["_s"] = time.monotonic() - t0

        thread = threading.Thread(target=run, name="kernelab-fingerprint", daemon=True)
        thread.start()
        return thread, found

    def collect_fingerprints(self, at_most: int | None = None) -> None:
        """Record the fingerprints made beside earlier evaluations that have ended; with
        ``at_most``, first wait for the oldest until no more than that many are being made."""
        while at_most is not None and len(self._prints) > at_most:
            self.keep_fingerprint(*self._prints.pop(0))
        for entry in [e for e in self._prints if not e[1].is_alive()]:
            self._prints.remove(entry)
            self.keep_fingerprint(*entry)

    def keep_fingerprint(self, cand_id: int, thread: threading.Thread, found: dict[str, Any]) -> None:
        thread.join()
        seconds = found.pop("_s", 0.0)
        self.rec.add_fingerprint(cand_id, found, seconds)
        if "kernels" in found:
            self.fingerprints[cand_id] = {"kernels": [
                {k: v for k, v in kernel.items() if k not in ("ptx", "sass")} for kernel in found["kernels"]]}

    def next_cost(self) -> float:
        """The next evaluation's expected seconds: the longest of the last three (they vary with
        compile times and with the candidate's speed; the first is often the dearest, the
        reference's compile and the CUDA contexts being new), 0 before any."""
        return max(self.costs[-3:], default=0.0)

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

    def prepare_proposers(self, proposers: list[Proposer]) -> None:
        """Let each proposer start what needs only the reference's source (the template's
        recognition) while the session opens: the first proposal came 14-29 s after an H200
        job's start, the session's opening and the recognition one after the other."""
        ctx = self.context()
        for proposer in proposers:
            prepare(proposer, ctx)

    def next_proposal(self, proposers: list[Proposer]) -> tuple[Proposal | Batch, str] | None:
        ctx = self.context()
        for proposer in proposers:
            answer = proposer.propose(ctx)
            self.record_failed(proposer)
            if isinstance(answer, Proposal | Batch):
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
            from kernelabd.service import screening

            self.collect_fingerprints(at_most=0)
            if self.session is not None:
                self.session.close()
            self.close_proposers()
            screening.close(self)

    def _run(self) -> Outcome:
        self.materialise_reference()
        self.check_reference()
        proposers = self._loaded = self.proposers()
        self.prepare_proposers(proposers)
        self.open_session()
        self.capture()
        from kernelabd.service import screening

        screening.prestart(self)
        for cand in [c for c in self.history if c.state != "done"]:
            self.rec.event("candidate.redo", f"#{cand.id} was in flight; evaluating it again",
                           job_id=self.job_id)
            self.evaluate(cand)
        self.start()
        while True:
            self.collect_fingerprints()
            if any(c.state == "done" for c in self.history):
                self.measure_peers()
            reason = stop_reason(self.limits, self.history, self.active_s, self.job.get("sol_ms"),
                                 self.next_cost(), best_peer_speedup(self.job.get("peers")))
            if reason is None:
                picked = self.next_proposal(proposers)
                if picked is None:
                    reason = "exhausted: no proposer has another candidate"
            if reason is not None:
                return self.finish(reason)
            proposal, name = picked
            if isinstance(proposal, Batch):
                screening.screen_batch(self, proposal, name)   # records and evaluates its contenders
            else:
                self.evaluate(self.record(proposal, name))

    def open_session(self) -> None:
        """The job-long reference: its sandbox, its memory plan and its float64 oracle, made
        once for every candidate of this run; a reference that cannot be used ends the job."""
        self.session = Session(self.problem, self.device, self.config, self.progress,
                               prestart=self.prestart)
        try:
            self.session.open()
        except Rejected as rej:
            if self.session.plan is not None:
                self.rec.update_job(self.job_id, {"plan": self.session.plan.to_json()})
            raise ReferenceInvalid(self.named(rej.result.reason or "the reference cannot be evaluated")) from None
        assert self.session.plan is not None
        plan = self.session.plan.to_json()
        self.rec.update_job(self.job_id, {"plan": plan})
        if plan["dropped"] or plan["oracle"] != "whole" or plan["timing_sets"] < 2 or not plan.get("screening", True):
            self.rec.event("plan.reduced", _plan_line(plan), job_id=self.job_id)

    def named(self, text: str) -> str:
        """A message about the job's copy of the reference, naming the file as the user did."""
        return text.replace(str(self.reference), self.reference.name)

    def start(self) -> None:
        """The dropped ``NAME.new.py`` is the job's first candidate, as it was dropped: one that
        is empty, not text, does not parse or defines no ``ModelNew`` is that candidate's
        recorded gate failure (``bad_candidate``, naming the file), never passed over for a
        proposer's."""
        source = self.job.get("start_source")
        if self.history or source is None:
            return
        where = f"{self.job['problem_name']}.new.py"
        try:
            validate_candidate(source, where)
        except ProblemError as exc:
            cand = self.record(Proposal(source=source, edit="starting candidate"), "start")
            self.rec.start_candidate(cand.id)
            data = CheckResult.invalid("bad_candidate", str(exc), self.device).to_json()
            self.rec.finish_candidate(self.job_id, cand.id, data, False)
            self.replace(cand, data, False)
            self.report(cand, data, False)
            return
        self.evaluate(self.record(Proposal(source=source, edit="starting candidate",
                                           params=params_of(source)), "start"))

    def capture(self) -> None:
        """FLOPs, bytes moved and launch records of the reference (from its sandbox), and the
        speed-of-light floor they give on this device, once per job."""
        if self.job.get("capture"):
            return
        from kernelabd.harness.sandbox import SandboxError

        assert self.session is not None
        self.progress("capturing the reference")
        try:
            data = self.session.capture()
        except SandboxError as exc:
            raise ReferenceInvalid(self.named(f"{self.reference}: capture failed: {exc.message}")) from None
        fields: dict[str, Any] = {"capture": data}
        sol = self.speed_of_light(data)
        if sol is not None:
            data["sol"] = sol
            fields["sol_ms"] = sol["ms"]
            self.job["sol_ms"] = sol["ms"]
        self.rec.update_job(self.job_id, fields)
        self.job["capture"] = data

    def measure_peers(self) -> None:
        """The reference under torch.compile, timed against eager once a job (``[jobs] peers``):
        what the user already has, and what a port must beat. Timed after the first candidate's
        evaluation rather than before it: with the peers first, an H200 job's first candidate came
        58-72 s after its start (bench/screen and bench/port results of 2026-12-02), and the
        first verified port is what a user waits for; only the stop rule and the report read the
        peers, both later."""
        if self.job.get("peers") or not self.config.jobs.peers:
            return
        assert self.session is not None
        peers = self.session.peers(list(self.config.jobs.peers))
        self.rec.update_job(self.job_id, {"peers": peers})
        self.job["peers"] = peers
        for key, why in peers["errors"].items():
            self.rec.event("peers.unmeasured", f"{key}: {why}", level="warning", job_id=self.job_id)

    def speed_of_light(self, capture: dict[str, Any]) -> dict[str, Any] | None:
        """The job's floor from this device's ceilings, measured once per device per home."""
        from kernelabd.service.ceilings import floor_ms, for_job

        ceilings = for_job(self.rec, self.job_id, self.device, self.config.timing.lock_clocks, self.progress)
        if ceilings is None:
            return None
        return floor_ms(capture, ceilings, tf32=self.problem.sidecar.tf32)

    def check_reference(self) -> Problem:
        """Static checks in trusted code, before any sandbox is started."""
        try:
            return self.problem
        except ProblemError as exc:
            raise ReferenceInvalid(str(exc).replace(str(self.reference), self.reference.name)) \
                from exc

    def finish(self, reason: str) -> Outcome:
        if self.incumbent is not None:
            return Outcome("done", stop_reason=reason)
        failures = [c for c in self.history if c.verdict in ("fail", "error")]
        start = f"{self.job['problem_name']}.new.py"
        if failures:
            last = failures[-1]
            who = f"{start} (the starting candidate)" if last.proposer == "start" else \
                f"#{last.id} by {last.proposer}"
            error = (f"no candidate passed the gate ({len(failures)} rejected; last: {who}: "
                     f"{last.rule}: {last.reason})")
        else:
            error = (f"no candidate to evaluate for {self.job['problem_name']}.py: no starting "
                     f"{start} and no proposer ({', '.join(self.limits.proposers) or 'none'}) produced one")
        return Outcome("failed", stop_reason=reason, error=_one_line(error))


def _plan_line(plan: dict[str, Any]) -> str:
    """The memory plan's reductions, in one line."""
    parts = [f"{plan['gate_sets']} gate set(s) of the main shape", f"{plan['timing_sets']} timing set(s)"]
    if plan["dropped"]:
        parts.append(f"dropped {', '.join(plan['dropped'])}")
    if plan["oracle"] != "whole":
        parts.append(f"float64 oracle in {plan['oracle_chunks']} batch chunks")
    if not plan.get("screening", True):
        parts.append("no screening (its sandbox does not fit; one tunable a candidate)")
    return "memory plan: " + "; ".join(parts)


def _speed(data: dict[str, Any]) -> str:
    ci = data.get("speedup_ci") or [None, None]
    if data.get("speedup") is None:
        return "not timed"
    lo, hi = (f"{v:.3f}" if v is not None else "?" for v in ci)
    versus = "reference" if data.get("baseline") == "reference" else "incumbent"
    return f"{data['speedup']:.3f}x [{lo}, {hi}] vs {versus} ({data.get('candidate_ms')} ms)"


def _one_line(text: str) -> str:
    return " ".join(text.split())[:500]
