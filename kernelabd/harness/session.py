"""One reference, many candidates: the trusted side of every evaluation.

A session starts the reference's sandbox once and keeps it for the whole job. The sandbox first
runs the reference once per shape (``probe``) so that the memory plan can decide what fits; then
it makes every input set from secret seeds, the re-randomised weights, its own fp32 outputs and
the float64 oracle, and keeps them in shared arenas that this process maps read-only. The seeds
are drawn again every ``[gate] reseed_every`` evaluations, so that what a proposer learns from
one candidate's failures does not carry to the next ones for long.

Each candidate gets a fresh sandbox and fresh copies of its weights and inputs, made here on the
device, never a handle on the oracle or on the reference's own buffers. Its outputs come back in
an arena of their own and are compared here, on the device, against the oracle; whether it wrote
into its inputs is seen by comparing its copies with the reference's. A candidate that passes is
timed in interleaved A/B blocks against the reference or the incumbent, whose sandbox is kept
warm between candidates. Nothing a candidate prints is read, and a failing one is never timed.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kernelabd.config import PEER_MODES, Config
from kernelabd.harness import gate, shared, wire
from kernelabd.harness.clocks import ClockError, ClockSampler, locked_clocks, summarise
from kernelabd.harness.containment import GPU_OUT_OF_MEMORY
from kernelabd.harness.plan import Plan, PlanError, make_plan, meminfo
from kernelabd.harness.problem import Problem, ProblemError, Sidecar, load_candidate
from kernelabd.harness.result import CheckResult
from kernelabd.harness.sandbox import Sandbox, SandboxError, SandboxSpec, canonical_device, head_start, make_undumpable
from kernelabd.harness.timing import Comparison, Measurement, TimerMismatch

SPOT_CHECKS = 12            # timed samples whose outputs are re-checked against the oracle
# Rules the sandbox may raise that are the candidate's fault (verdict fail, not error).
REFUSAL_RULES = frozenset({"state_dict", "not_a_tensor", "tampering", "compile"})
# Targets with no CPU path: Triton has an interpreter, CUDA C++ compiled by NVRTC does not.
GPU_ONLY_TARGETS = frozenset({"cuda"})

Progress = Callable[[str], None]


class Rejected(Exception):
    """Ends an evaluation early with a finished result."""

    def __init__(self, result: CheckResult) -> None:
        super().__init__(result.reason)
        self.result = result


def needs_gpu(problem: Problem, candidate: Path) -> str:
    """Why a check of a GPU-only target cannot run on CPU, naming the files, in one line."""
    where = problem.sidecar_path or problem.path
    return (f"{candidate}: target {problem.sidecar.target!r} (set in {where}) compiles and "
            "launches CUDA C++ kernels, which need a GPU; this check runs on cpu "
            "(use --device cuda)")


def take_spare(spares: dict[str, Sandbox], device: str) -> Sandbox | None:
    """A started sandbox for ``device`` out of ``spares``, if one is there. Devices are compared
    as the sandboxes name them (``cuda`` is ``cuda:0``): a job on ``cuda`` once never found the
    spare it had started for ``cuda:0``, and paid a cold start (3-5 s on an H200) per candidate."""
    want = canonical_device(device)
    label = next((k for k, b in spares.items() if canonical_device(b.spec.device) == want), None)
    return spares.pop(label) if label is not None else None


def gate_shapes(sidecar: Sidecar, device: str) -> list[dict[str, Any]]:
    """The module constants of every shape the gate checks: the device's sizes (timed too),
    then the sidecar's ``extra_shapes`` (gated only)."""
    return [sidecar.constants_for(device), *sidecar.extra_shapes]


def plan_sets(plan: Plan, n_shapes: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Gate input sets (the plan's variants of the main shape, one base set of each other
    shape) and timing sets, each from a fresh secret seed."""
    sets = [{"shape": 0, "seed": secrets.randbits(62), "variant": v} for v in plan.variants]
    sets += [{"shape": s, "seed": secrets.randbits(62), "variant": "base"} for s in range(1, n_shapes)]
    timing = [{"shape": 0, "seed": secrets.randbits(62), "variant": "base"} for _ in range(plan.timing_sets)]
    return sets, timing


def where_it_stopped(detail: str) -> str:
    """The last piece of evaluated code the sandbox said it was running (its stderr marks)."""
    marks = re.findall(rf"{wire.STAGE_MARK}(.+)", detail or "")
    return marks[-1].strip() if marks else ""


def sandbox_failure(exc: SandboxError, who: str, device: str) -> CheckResult:
    """Map how a candidate's sandbox failed to a verdict: refusals fail, the rest are errors."""
    if exc.rule == "bad_candidate":
        return CheckResult.invalid("bad_candidate", f"{who}: {exc.message}", device)
    if exc.rule in REFUSAL_RULES:
        return CheckResult(verdict="fail", rule=exc.rule, reason=exc.message, evidence=exc.evidence,
                           device=device)
    rule = {"raised": "exception"}.get(exc.kind, exc.kind)
    if exc.kind == "raised":
        rule = memory_rule(exc.message, rule)
    evidence = {"stderr_tail": exc.detail[-1500:]} if exc.detail else {}
    return CheckResult(verdict="error", rule=rule, reason=f"{who}: {exc.message}",
                       evidence=evidence, device=device)


def memory_rule(said: str, otherwise: str) -> str:
    """``out_of_memory`` where a process says the GPU was full, else ``otherwise``: one rule for
    a device short of memory, wherever in an evaluation it happened."""
    return "out_of_memory" if GPU_OUT_OF_MEMORY.search(said) else otherwise


def arena_failure(exc: shared.ArenaError, device: str) -> CheckResult:
    """The trusted process could not make a candidate's copies: an evaluation's failure (the
    device is full now), not the job's."""
    return CheckResult(verdict="error", rule=memory_rule(str(exc), "arena"), reason=f"trusted process: {exc}",
                       device=device)


def reference_failure(exc: SandboxError | PlanError, problem: Problem, device: str) -> CheckResult:
    """A reference that cannot be evaluated, in one line naming the file and where it failed."""
    if isinstance(exc, PlanError):
        result = CheckResult.invalid("too_big", f"{problem.path}: {exc}", device)
        return result
    place = where_it_stopped(exc.detail)
    at = f" (in {place})" if place and exc.kind != "raised" else ""
    rule = "too_big" if exc.rule == "too_big" else "bad_reference"
    message = re.sub(rf":\s*{wire.STAGE_MARK}.*$", "", exc.message)
    result = CheckResult.invalid(rule, f"{problem.path}: {message}{at}", device)
    result.evidence = {"stderr_tail": exc.detail[-3000:]} if exc.detail else {}
    return result


@dataclass
class RefSet:
    """One input set of the reference, as this process sees it in the reference's arena."""

    shape: int
    variant: str
    kinds: list[str]
    scalars: list[Any]
    inputs: list[shared.Slot]
    oracle: list[shared.Slot]
    outputs: list[dict[str, Any]]
    calib: dict[str, Any]
    arena: shared.Arena

    def input_tensors(self) -> list[torch.Tensor]:
        return shared.views(self.arena, self.inputs)

    def oracle_tensors(self) -> list[torch.Tensor]:
        return shared.views(self.arena, self.oracle)

    def entry(self, slots: list[shared.Slot]) -> dict[str, Any]:
        """How a sandbox finds this set's inputs in a copy laid out as ``slots``."""
        return {"kinds": self.kinds, "scalars": self.scalars, "inputs": [s.to_json() for s in slots]}

    def output_bytes(self) -> int:
        return sum(shared.Slot(0, o["dtype"], o["shape"]).nbytes for o in self.outputs)


@dataclass
class Reference:
    """What the reference sandbox made for the current seeds."""

    shapes: list[dict[str, Any]]
    state: shared.Arena
    state_slots: list[list[shared.Slot]]
    sets: list[RefSet]
    n_gate: int
    info: dict[str, Any]
    arenas: list[shared.Arena] = field(default_factory=list)

    @property
    def timing(self) -> list[RefSet]:
        return self.sets[self.n_gate:]

    def close(self) -> None:
        for arena in self.arenas:
            arena.close()


@dataclass
class Held:
    """A loaded candidate sandbox and the file it runs (a candidate under evaluation or the
    incumbent kept warm for the next comparison)."""

    path: Path
    box: Sandbox


class Session:
    """The sandboxes and shared data of one reference on one device, for many evaluations."""

    def __init__(self, problem: Problem, device: str, config: Config, progress: Progress | None = None,
                 early: dict[str, Sandbox] | None = None, prestart: bool = False) -> None:
        self.problem, self.device, self.config = problem, device, config
        self.progress = progress or (lambda _msg: None)
        self.spares = dict(early or {})
        self.prestart = prestart
        self.ref_box: Sandbox | None = None
        self.ref: Reference | None = None
        self.plan: Plan | None = None
        self.usable: list[int] = []
        self.incumbent: Held | None = None
        self.pending: Held | None = None
        self.evaluated_since_seed = 0
        self.stages: dict[str, float] = {}
        self.deadline = 0.0
        self.reference_s = 0.0

    # ----- sandboxes -----------------------------------------------------------------------
    def spec(self, label: str) -> SandboxSpec:
        return SandboxSpec.from_config(self.config.sandbox, self.device, label)

    def box(self, label: str) -> Sandbox:
        """A started sandbox: one given a head start if there is one, else a new one; on a GPU
        the next one is started at once, so that its interpreter, torch and CUDA context come
        up while this one works."""
        box = take_spare(self.spares, self.device)
        if box is None:
            box = Sandbox(self.spec(label))
            box.start()
        if self.prestart and not self.spares:
            self.spares = head_start(self.device, self.config.sandbox, ("candidate",))
        return box

    @contextmanager
    def stage(self, name: str, message: str) -> Iterator[None]:
        self.progress(message)
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.stages[name] = round(self.stages.get(name, 0.0) + time.monotonic() - t0, 3)

    def request(self, box: Sandbox, header: dict[str, Any], what: str, arenas: list[shared.Arena] = (),
                ) -> tuple[dict[str, Any], list[int]]:
        """One request carrying ``arenas``' descriptors; returns the reply and the descriptors
        that came back (the caller owns them; on a failure they are closed here)."""
        sent = [a.export() for a in arenas]
        received: list[int] = []
        try:
            reply, _ = box.request({**header, "arenas": [a.nbytes for a in arenas]}, deadline=self.deadline,
                                   what=what, fds=sent, received=received)
        except BaseException:
            for fd in received:
                os.close(fd)
            raise
        finally:
            for fd in sent:
                os.close(fd)
        return reply, received

    # ----- the reference -------------------------------------------------------------------
    def open(self) -> None:
        """Start the reference sandbox, plan the job's memory and make the reference's data;
        raises ``Rejected`` (rule bad_reference or too_big) when the reference cannot be used."""
        make_undumpable()
        if self.device != "cpu":   # our CUDA context, for copies and comparisons, meanwhile
            threading.Thread(target=torch.cuda.init, daemon=True).start()
        self.deadline = time.monotonic() + self.config.gate.timeout_s
        t0 = time.monotonic()
        try:
            self.ref_box = self.box("reference")
            self.progress("running the reference once to plan its memory")
            self.seeds = [secrets.randbits(62) for _ in gate_shapes(self.problem.sidecar, self.device)]
            header = self.reference_header()
            meta, _ = self.request(self.ref_box, {**header, "cmd": "probe_meta"}, "sizing the reference")
            if meta.get("shapes"):     # far too large: refused before anything is allocated
                self.plan_for(meta["shapes"], self.device_memory())
            probe, _ = self.request(self.ref_box, {**header, "cmd": "probe", "seed": secrets.randbits(62)},
                                    "running the reference")
            info = probe.get("info", {})
            self.plan = self.plan_for(probe["shapes"], (int(info.get("device_total_bytes", 0)),
                                                        int(info.get("device_free_bytes", 0))))
            self.load_reference()
        except (SandboxError, PlanError) as exc:
            raise Rejected(reference_failure(exc, self.problem, self.device)) from None
        finally:
            self.reference_s = time.monotonic() - t0

    def device_memory(self) -> tuple[int, int]:
        """(total, free) bytes of this job's device, as this process sees it."""
        if self.device == "cpu":
            return 0, 0
        free, total = torch.cuda.mem_get_info(torch.device(self.device))
        return int(total), int(free)

    def plan_for(self, shapes: list[dict[str, Any]], device: tuple[int, int]) -> Plan:
        return make_plan(shapes, self.device, device[0], device[1], meminfo("MemTotal"),
                         meminfo("MemAvailable"), list(self.problem.sidecar.variants))

    def reference_header(self) -> dict[str, Any]:
        path = self.ref_box.stage_file(self.problem.path, self.problem.path.name)
        return {"path": path, "device": self.device, "tf32": self.problem.sidecar.tf32,
                "shapes": gate_shapes(self.problem.sidecar, self.device), "param_seeds": self.seeds}

    def load_reference(self) -> None:
        """Make (again, with new seeds after the first time) every input set and its oracle."""
        assert self.ref_box is not None and self.plan is not None
        self.progress("running the reference and the float64 oracle")
        sets, timing = plan_sets(self.plan, len(gate_shapes(self.problem.sidecar, self.device)))
        if self.ref is not None:
            self.ref.close()
            self.ref = None
        reply, fds = self.request(self.ref_box, {**self.reference_header(), "cmd": "load_reference",
                                                 "sets": sets, "timing_sets": timing,
                                                 "oracle_chunks": self.plan.oracle_chunks,
                                                 "oracle_whole_fits": self.plan.oracle_whole_fits},
                                  "running the reference")
        self.ref = self.map_reference(reply, fds, sets + timing, len(sets))
        self.record_oracle_chunks(int(reply.get("oracle_chunks", self.plan.oracle_chunks)))
        self.usable = self.validate_reference()
        self.evaluated_since_seed = 0
        if self.incumbent is not None:
            self.retime(self.incumbent.box)

    def reseed(self) -> None:
        """New secret gate inputs. Short of GPU memory for them (what the job's other processes
        hold now), the incumbent's sandbox is given up (it is started again when it is next the
        baseline) and the sets are drawn once more: a full device costs a restart, not the job."""
        self.deadline = time.monotonic() + self.config.gate.timeout_s
        try:
            self.load_reference()
        except (SandboxError, Rejected) as exc:
            said = exc.message if isinstance(exc, SandboxError) else exc.result.reason or ""
            if self.incumbent is None or not GPU_OUT_OF_MEMORY.search(said):
                raise
            self.progress("out of GPU memory for new gate inputs: restarting the incumbent's sandbox")
            self.drop_incumbent()
            self.deadline = time.monotonic() + self.config.gate.timeout_s
            self.load_reference()

    def record_oracle_chunks(self, chunks: int) -> None:
        """The plan as run: a reference that is not separable along its batch had its oracle
        made whole where the plan chose chunks only for margin."""
        assert self.plan is not None
        if chunks != self.plan.oracle_chunks:
            self.progress(f"float64 oracle made whole: the reference is not separable in "
                          f"{self.plan.oracle_chunks} batch chunks")
            self.plan.oracle_chunks, self.plan.oracle = chunks, "chunked" if chunks > 1 else "whole"

    def map_reference(self, reply: dict[str, Any], fds: list[int], plan: list[dict[str, Any]],
                      n_gate: int) -> Reference:
        sizes = reply.get("arenas", [])
        if len(sizes) != len(fds) or not fds:
            for fd in fds:
                os.close(fd)
            raise SandboxError("protocol", "reference sandbox sent arenas that do not match its reply")
        arenas = [shared.Arena.open(self.device, fd, int(n), writable=False) for fd, n in zip(fds, sizes, strict=True)]
        state = arenas[0]
        try:
            state_slots = [[shared.Slot.from_json(s, state.nbytes) for s in shape["state"]]
                           for shape in reply["shapes"]]
            sets = []
            for entry, p in zip(reply["sets"], plan, strict=True):
                arena = arenas[int(entry["arena"])]
                sets.append(RefSet(shape=p["shape"], variant=p["variant"], kinds=entry["kinds"],
                                   scalars=entry["scalars"],
                                   inputs=[shared.Slot.from_json(s, arena.nbytes) for s in entry["inputs"]],
                                   oracle=[shared.Slot.from_json(s, arena.nbytes) for s in entry["oracle"]],
                                   outputs=entry["outputs"], calib=entry["calib"], arena=arena))
        except (KeyError, TypeError, ValueError, IndexError, shared.ArenaError) as exc:
            for arena in arenas:
                arena.close()
            raise SandboxError("protocol", f"reference sandbox sent a malformed reply: {exc}") from None
        return Reference(shapes=reply["shapes"], state=state, state_slots=state_slots, sets=sets,
                         n_gate=n_gate, info=reply.get("info", {}), arenas=arenas)

    def validate_reference(self) -> list[int]:
        """Indices of usable gate sets; a variant on which even the reference breaks is dropped."""
        assert self.ref is not None
        usable = []
        for i, rs in enumerate(self.ref.sets[:self.ref.n_gate]):
            if rs.calib["finite"]:
                usable.append(i)
            elif i == 0:
                raise Rejected(CheckResult.invalid(
                    "bad_reference", f"{self.problem.path}: reference output has NaN/Inf on its own "
                    "inputs", self.device))
        base = [i for i in usable if self.ref.sets[i].variant == "base" and self.ref.sets[i].shape == 0]
        why = gate.check_reference([rs.oracle_tensors() for rs in self.ref.sets[:self.ref.n_gate]], base)
        if why:
            raise Rejected(CheckResult.invalid("bad_reference", f"{self.problem.path}: {why}", self.device))
        return usable

    def capture(self) -> dict[str, Any]:
        """FLOPs, bytes and launch records of the reference, from its own sandbox."""
        assert self.ref_box is not None
        self.deadline = time.monotonic() + self.config.gate.timeout_s
        reply, _ = self.request(self.ref_box, {"cmd": "capture"}, "capturing the reference")
        return reply

    # ----- copies for a candidate ----------------------------------------------------------
    def copies(self, tensors: list[torch.Tensor]) -> tuple[shared.Arena, list[shared.Slot]]:
        """Fresh copies, in a new arena, of tensors of the reference's (a candidate's own)."""
        try:
            return shared.pack(tensors, self.device)
        except shared.ArenaError as exc:
            raise Rejected(arena_failure(exc, self.device)) from None

    def load(self, box: Sandbox, path: Path, cmd: str = "load_candidate", timing: bool = True,
             **extra: Any) -> dict[str, Any]:
        """Load a candidate (or a peer) with copies of the weights and, unless ``timing`` is
        False (a candidate gets them once it has passed the gate), of the timing inputs."""
        assert self.ref is not None
        ref = self.ref
        state, slots = self.copies([t for shape in ref.state_slots for t in shared.views(ref.state, shape)])
        it = iter(slots)
        shapes = [{"init_inputs": s["init_inputs"], "state_keys": s["state_keys"], "constants": constants,
                   "state": [next(it).to_json() for _ in s["state_keys"]]}
                  for s, constants in zip(ref.shapes, gate_shapes(self.problem.sidecar, self.device), strict=True)]
        arenas, entries = [state], []
        if timing:
            copies, entries = self.timing_copies()
            arenas.append(copies)
        try:
            reply, _ = self.request(box, {"cmd": cmd, "path": box.stage_file(path, path.name),
                                          "device": self.device, "target": self.problem.sidecar.target,
                                          "tf32": self.problem.sidecar.tf32, "shapes": shapes,
                                          "timing_sets": entries, **extra},
                                    f"loading {path.name}", arenas)
        finally:
            for arena in arenas:
                arena.close()
        return reply

    def timing_copies(self) -> tuple[shared.Arena, list[dict[str, Any]]]:
        assert self.ref is not None
        tensors = [t for rs in self.ref.timing for t in rs.input_tensors()]
        arena, slots = self.copies(tensors)
        it, entries = iter(slots), []
        for rs in self.ref.timing:
            entries.append(rs.entry([next(it) for _ in rs.inputs]))
        return arena, entries

    def retime(self, box: Sandbox) -> None:
        arena, entries = self.timing_copies()
        try:
            self.request(box, {"cmd": "retime", "timing_sets": entries}, "taking new timing inputs", [arena])
        finally:
            arena.close()

    # ----- one evaluation ------------------------------------------------------------------
    def evaluate(self, candidate: Path, baseline: Path | None = None, time_it: bool = True,
                 compiled_in: Sandbox | None = None) -> CheckResult:
        """Gate ``candidate`` and, if it passes, time it against ``baseline`` (None: the
        reference). Its sandbox stays open until ``promote`` or the next evaluation.
        ``compiled_in``: a sandbox that already compiled this very source (the screening
        sandbox of a screened winner), whose Triton cache the candidate's starts from."""
        self.stages = {}
        self.discard()
        t0 = time.monotonic()
        try:
            result = self._evaluate(candidate, baseline, time_it, compiled_in)
        except Rejected as rej:
            result = rej.result
        if self.reference_s:
            self.stages["reference"] = round(self.reference_s, 3)
            self.reference_s = 0.0
        result.stages = dict(self.stages)
        result.wall_s = round(time.monotonic() - t0, 3)
        return result

    def _evaluate(self, candidate: Path, baseline: Path | None, time_it: bool,
                  compiled_in: Sandbox | None) -> CheckResult:
        if self.problem.sidecar.target in GPU_ONLY_TARGETS and self.device == "cpu":
            return CheckResult.invalid("bad_arguments", needs_gpu(self.problem, candidate), self.device)
        try:
            load_candidate(candidate)
            if baseline is not None:
                load_candidate(baseline)
        except ProblemError as exc:
            return CheckResult.invalid("bad_candidate", str(exc), self.device)
        reseed = self.config.gate.reseed_every
        if reseed and self.evaluated_since_seed >= reseed:
            t0 = time.monotonic()
            try:
                self.reseed()
            except SandboxError as exc:
                raise Rejected(reference_failure(exc, self.problem, self.device)) from None
            self.reference_s = time.monotonic() - t0
        self.evaluated_since_seed += 1
        self.deadline = time.monotonic() + self.config.gate.timeout_s
        with self.stage("sandbox_start", "starting the candidate's sandbox"):
            box = self.box("candidate")
            self.pending = Held(candidate, box)
            if compiled_in is not None:
                self.carry_cache(compiled_in, box)
            try:
                self.load(box, candidate, timing=False)
            except SandboxError as exc:
                raise Rejected(sandbox_failure(exc, "candidate", self.device)) from None
        with self.stage("gate", "gating the candidate"):
            max_err, tol = self.gate(box)
        if time_it or self.config.gate.reseed_every:
            try:
                self.retime(box)            # it may become the incumbent: it needs them either way
            except SandboxError as exc:
                raise Rejected(sandbox_failure(exc, "candidate", self.device)) from None
        result = CheckResult(verdict="pass", max_rel_error=max_err, tolerance=tol, device=self.device,
                             input_sets=len(self.usable),
                             baseline=str(baseline) if baseline else "reference")
        if time_it:
            a = self.baseline_box(baseline)
            with self.stage("timing", "timing against the baseline"):
                self.time_against(a, box, result)
        return result

    def carry_cache(self, source: Sandbox, box: Sandbox) -> None:
        """The kernels ``source`` compiled, copied into the candidate's cache before it loads."""
        with self.stage("cache_carry", "carrying the screening sandbox's compiled kernels"):
            carried = box.carry_triton_cache(source)
        if carried.entries:
            self.progress(f"carried {carried.entries} compiled kernels ({carried.bytes / 2**20:.1f} MiB) "
                          "from the screening sandbox")

    def baseline_box(self, baseline: Path | None) -> Sandbox:
        """The reference's sandbox, or the incumbent's, started and loaded if it is not yet."""
        assert self.ref_box is not None
        if baseline is None:
            return self.ref_box
        if self.incumbent is not None and self.incumbent.path == baseline:
            return self.incumbent.box
        self.drop_incumbent()
        box = self.box("baseline")
        self.incumbent = Held(baseline, box)
        with self.stage("sandbox_start", "loading the baseline"):
            try:
                self.load(box, baseline)
            except SandboxError as exc:
                raise Rejected(CheckResult(verdict="error", rule="baseline", device=self.device,
                                           reason=f"baseline {baseline}: {exc.message}")) from None
        return box

    def promote(self) -> None:
        """Keep the candidate just evaluated, and its warm sandbox, as the incumbent."""
        if self.pending is not None:
            self.drop_incumbent()
            self.incumbent, self.pending = self.pending, None

    def discard(self) -> None:
        if self.pending is not None:
            self.pending.box.close()
            self.pending = None

    def drop_incumbent(self) -> None:
        if self.incumbent is not None:
            self.incumbent.box.close()
            self.incumbent = None

    # ----- the gate ------------------------------------------------------------------------
    def gate(self, box: Sandbox) -> tuple[float, float]:
        """Every usable gate set, then the first again (determinism); raises ``Rejected``. The
        first set's outputs stay mapped until they are compared with the second run's."""
        assert self.ref is not None
        worst_norm, worst_tol = 0.0, None
        with ExitStack() as keep:
            first: list[torch.Tensor] | None = None
            for i in self.usable:
                rs = self.ref.sets[i]
                tol = self.tolerance(i)
                with ExitStack() as this:
                    report, outs = this.enter_context(self.gated(box, rs))
                    failure = self.rules(rs, report, outs, i)
                    if failure is None:
                        failure, outcome = gate.check_numerics(outs, rs.oracle_tensors(), tol, i)
                        if outcome.norm_error >= worst_norm:
                            worst_norm, worst_tol = outcome.norm_error, tol.norm
                    self.fail_if(failure, worst_norm, tol.norm)
                    if first is None:
                        first = outs
                        keep.enter_context(this.pop_all())
            assert first is not None
            with self.gated(box, self.ref.sets[self.usable[0]]) as (_, again):
                self.fail_if(gate.check_deterministic(first, again, self.tolerance(self.usable[0])),
                             worst_norm, worst_tol)
        return worst_norm, worst_tol if worst_tol is not None else 0.0

    @contextmanager
    def gated(self, box: Sandbox, rs: RefSet) -> Iterator[tuple[dict[str, Any], list[torch.Tensor]]]:
        """One gated call on fresh copies of a set's inputs; yields the sandbox's report and
        its outputs (mapped from its arena), with ``mutated`` filled in here."""
        arena, slots = self.copies(rs.input_tensors())
        out: shared.Arena | None = None
        try:
            header = {"cmd": "gate_set", "shape": rs.shape, **rs.entry(slots), "expect": rs.outputs,
                      "poison_bytes": 2 * rs.output_bytes()}
            t0 = time.monotonic()
            try:
                reply, fds = self.request(box, header, "running the candidate", [arena])
            except SandboxError as exc:
                raise Rejected(sandbox_failure(exc, "candidate", self.device)) from None
            finally:     # part of "gate": the candidate's JIT compile happens in its first call
                self.stages.setdefault("gate_first_call", round(time.monotonic() - t0, 3))
            out, outs, report = self.outputs(reply, fds)
            report["mutated"] = [j for j, (mine, theirs) in
                                 enumerate(zip(shared.views(arena, slots), rs.input_tensors(), strict=True))
                                 if not gate.same_bits(mine, theirs)]
            yield report, outs
        finally:
            arena.close()
            if out is not None:
                out.close()

    def outputs(self, reply: dict[str, Any], fds: list[int]) -> tuple[shared.Arena, list[torch.Tensor], dict]:
        report = reply.get("report")
        try:
            if not isinstance(report, dict) or len(fds) != 1:
                raise ValueError("no report or no output arena")
            out = shared.Arena.open(self.device, fds[0], int(reply["arenas"][0]), writable=False)
        except (ValueError, KeyError, TypeError, IndexError, shared.ArenaError) as exc:
            for fd in fds:
                os.close(fd)
            raise Rejected(CheckResult(verdict="error", rule="protocol", device=self.device,
                                       reason=f"candidate sandbox sent a malformed gate report: {exc}")) from None
        try:
            outs = [out.tensor(shared.Slot.from_json(s, out.nbytes)) for s in reply.get("outputs", [])]
        except shared.ArenaError as exc:
            out.close()
            raise Rejected(CheckResult(verdict="error", rule="protocol", device=self.device,
                                       reason=f"candidate sandbox sent a malformed gate report: {exc}")) from None
        return out, outs, report

    def rules(self, rs: RefSet, report: dict[str, Any], outs: list[torch.Tensor], i: int) -> gate.Failure | None:
        target = self.problem.sidecar.target
        return (gate.check_structure(rs.outputs, report.get("outputs", []), i)
                or gate.check_written(report.get("poisoned", []), report["outputs"], i)
                or gate.check_synchronised(report.get("unsynchronised", []), i)
                or gate.check_finite(outs, i)
                or gate.check_inputs_untouched(report.get("mutated", []), i)
                or gate.check_target_launched(int(report.get("launches", 0)), target, i)
                or gate.check_no_torch_compute(report.get("torch_ops", {}), i))

    def tolerance(self, i: int) -> gate.Tolerance:
        assert self.ref is not None
        side = self.problem.sidecar
        factor = side.tol_factor or self.config.gate.tol_factor
        return gate.tolerance_for(self.ref.sets[i].calib, factor, side.tolerance)

    def fail_if(self, failure: gate.Failure | None, max_err: float, tol: float | None) -> None:
        if failure is not None:
            raise Rejected(CheckResult(
                verdict="fail", rule=failure.rule, reason=failure.reason, evidence=failure.evidence,
                max_rel_error=failure.evidence.get("max_rel_error", max_err or None),
                tolerance=failure.evidence.get("tolerance", tol), device=self.device))

    # ----- timing --------------------------------------------------------------------------
    def compare(self, a: Sandbox, b: Sandbox) -> tuple[Measurement, dict[str, Any] | None]:
        """Interleaved A/B blocks of ``b`` against ``a``, and the clock state they ran under
        (None on CPU)."""
        sampler, clock_error = self.clock_sampler()
        mode = self.config.timing.lock_clocks
        with locked_clocks(sampler, mode) if sampler and mode != "off" else nullcontext() as locked:
            meas = Comparison(a, b, self.config.timing, self.device, sampler, self.deadline,
                              self.progress).run()
        if self.device == "cpu":
            return meas, None
        clock = summarise(meas.clock_samples, locked, meas.discarded) if sampler else {"error": clock_error}
        clock.update(timing_mode=meas.mode, trusted_ms=meas.trusted_ms)
        return meas, clock

    def time_against(self, a: Sandbox, b: Sandbox, result: CheckResult) -> None:
        """Time ``b`` (the candidate) against ``a``; the reference sandbox re-checks outputs
        sampled from the timed calls."""
        assert self.ref is not None
        try:
            meas, clock = self.compare(a, b)
        except TimerMismatch as exc:
            raise Rejected(CheckResult(verdict="fail", rule="timer_mismatch", reason=str(exc),
                                       device=self.device)) from None
        except SandboxError as exc:
            raise Rejected(sandbox_failure(exc, "candidate (while timed)", self.device)) from None
        finally:
            self.release_baseline(a)
        self.verify_timed(meas)
        d = meas.decision
        result.reference_ms, result.candidate_ms = meas.a_ms, meas.b_ms
        result.speedup, result.speedup_ci = d.speedup, [d.ci[0], d.ci[1]]
        result.faster_than_noise, result.aa_noise, result.threshold = d.faster, d.aa_noise, d.threshold
        result.blocks = meas.blocks
        result.timed_sets = len(self.ref.timing)
        result.clock = clock

    def release_baseline(self, a: Sandbox) -> None:
        """The reference's work buffers and graphs go once it has served as a baseline."""
        if a is self.ref_box:
            with contextlib.suppress(SandboxError):
                self.request(a, {"cmd": "release_timing"}, "releasing timing buffers")

    def clock_sampler(self) -> tuple[ClockSampler | None, str]:
        """The device's clock sampler, or None and why there is none (reported with the time)."""
        if self.device == "cpu":
            return None, "no GPU"
        assert self.ref is not None
        try:
            return ClockSampler(str(self.ref.info.get("uuid", ""))), ""
        except ClockError as exc:
            return None, str(exc)

    def verify_timed(self, meas: Any) -> None:
        """Outputs produced while timed must be as correct as those produced while gated.

        Samples are drawn at random after the fact, so the candidate cannot know which of its
        timed calls will be checked; the reference sandbox recomputes their float64 oracle on
        the same perturbed inputs and fingerprints it with the same weights.
        """
        assert self.ref is not None and self.ref_box is not None
        chosen = sorted(secrets.SystemRandom().sample(sorted(meas.fingerprints),
                                                      min(SPOT_CHECKS, len(meas.fingerprints))))
        try:
            reply, _ = self.request(self.ref_box, {"cmd": "oracle_fingerprints", "samples": chosen, **meas.seeds},
                                    "recomputing timed outputs")
        except SandboxError as exc:      # short of GPU memory: this timing's failure, not the reference's
            raise Rejected(CheckResult(verdict="error", rule=memory_rule(exc.message, "bad_reference"),
                                       device=self.device,
                                       reason=f"reference while re-checking: {exc.message}")) from None
        n_sets, n_gate = len(self.ref.timing), self.ref.n_gate
        for s, expected in zip(chosen, reply["samples"], strict=True):
            tol = gate.tolerance_for(self.ref.sets[n_gate + s % n_sets].calib,
                                     self.problem.sidecar.tol_factor or self.config.gate.tol_factor,
                                     self.problem.sidecar.tolerance)
            self.fail_if(gate.check_fingerprints(meas.fingerprints[s], expected, tol, s), 0.0, None)

    # ----- peers ---------------------------------------------------------------------------
    def peers(self, modes: list[str]) -> dict[str, Any]:
        """The reference under torch.compile (``PEER_MODES``), each timed in interleaved A/B
        blocks against eager in the reference's sandbox: what the user already has."""
        assert self.ref_box is not None
        found: dict[str, Any] = {"eager_ms": None, "errors": {}, "note": None, "best": "eager"}
        for key in modes:
            found[f"{key}_ms"] = found[f"{key}_speedup"] = None
        if self.device == "cpu":     # a C++ compile per job, and times that say nothing of a GPU's
            found["note"] = "torch.compile is timed on GPU jobs only"
            return found
        for key in modes:
            mode = PEER_MODES[key]
            self.progress(f"timing the reference under torch.compile ({mode})")
            self.deadline = time.monotonic() + self.config.gate.timeout_s
            box = self.box("peer")
            try:
                self.load(box, self.problem.path, cmd="load_peer", mode=mode,
                          constants=gate_shapes(self.problem.sidecar, self.device)[0])
                meas, _ = self.compare(self.ref_box, box)
            except (SandboxError, TimerMismatch) as exc:
                found["errors"][key] = str(getattr(exc, "message", exc))[:300]
                continue
            finally:
                box.close()
                self.release_baseline(self.ref_box)
            found["eager_ms"] = found["eager_ms"] or meas.a_ms
            found[f"{key}_ms"], found[f"{key}_speedup"] = meas.b_ms, meas.decision.speedup
        speedups = {k: found.get(f"{k}_speedup") or 0.0 for k in modes}
        best = max(speedups, key=lambda k: speedups[k], default=None)
        found["best"] = best if best is not None and speedups[best] > 1.0 else "eager"
        return found

    # ----- the end -------------------------------------------------------------------------
    def close(self) -> None:
        """Every sandbox is signalled before any is waited for, so their CUDA contexts are torn
        down in parallel; then the mapped arenas are released."""
        boxes = [b for b in [self.ref_box, *(h.box for h in (self.pending, self.incumbent) if h),
                             *self.spares.values()] if b is not None]
        for box in boxes:
            box.kill()
        if self.ref is not None:
            self.ref.close()
            self.ref = None
        for box in boxes:
            box.close()
        self.ref_box, self.pending, self.incumbent, self.spares = None, None, None, {}

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
