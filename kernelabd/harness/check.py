"""One check: gate a candidate against the float64 oracle, then time it against a baseline.

The flow keeps three kinds of process apart. The reference sandbox builds inputs from secret
seeds, re-randomised parameters, its own fp32 outputs and the float64 oracle. The candidate
sandbox receives inputs and parameters only — never an expected output — and returns its
outputs. This process, which runs no evaluated code, compares them (``gate``), drives the
timing (``timing``) and applies the acceptance rule (``accept``). A failing candidate is never
timed; a timed one has the outputs it produced while being timed checked again.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kernelabd.config import Config
from kernelabd.harness import gate
from kernelabd.harness.clocks import ClockError, ClockSampler, locked_clocks, summarise
from kernelabd.harness.problem import Problem, ProblemError, Sidecar, load_candidate, load_problem
from kernelabd.harness.result import CheckResult
from kernelabd.harness.sandbox import Sandbox, SandboxError, SandboxSpec, canonical_device, make_undumpable
from kernelabd.harness.timing import Comparison, TimerMismatch

GATE_VARIANT_SETS = ("base", "base", "scaled", "heavy")   # per main shape; "base" twice: 2 seeds
TIMING_SETS = 2
SPOT_CHECKS = 12            # timed samples whose outputs are re-checked against the oracle
# Rules the sandbox may raise that are the candidate's fault (verdict fail, not error).
REFUSAL_RULES = frozenset({"state_dict", "not_a_tensor", "tampering", "compile"})

# Targets with no CPU path: Triton has an interpreter, CUDA C++ compiled by NVRTC does not.
GPU_ONLY_TARGETS = frozenset({"cuda"})

Progress = Callable[[str], None]


def needs_gpu(problem: Problem, candidate: Path) -> str:
    """Why a check of a GPU-only target cannot run on CPU, naming the files, in one line."""
    where = problem.sidecar_path or problem.path
    return (f"{candidate}: target {problem.sidecar.target!r} (set in {where}) compiles and "
            "launches CUDA C++ kernels, which need a GPU; this check runs on cpu "
            "(use --device cuda)")


class Rejected(Exception):
    """Ends a check early with a finished result."""

    def __init__(self, result: CheckResult) -> None:
        super().__init__(result.reason)
        self.result = result


@dataclass
class RefData:
    """What the reference sandbox produced, split per shape and per input set."""

    shapes: list[dict[str, Any]]
    state: list[list[torch.Tensor]]
    sets: list[dict[str, Any]]                   # header entries (kinds, scalars, outputs)
    inputs: list[list[torch.Tensor]]
    oracle: list[list[torch.Tensor]]
    info: dict[str, Any] = field(default_factory=dict)


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


def gate_shapes(sidecar: Sidecar, device: str) -> list[dict[str, Any]]:
    """The module constants of every shape the gate checks: the device's sizes (timed too),
    then the sidecar's ``extra_shapes`` (gated only)."""
    return [sidecar.constants_for(device), *sidecar.extra_shapes]


def plan_sets(problem: Problem, device: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Shapes (module constants), gate input sets and timing input sets, from secret seeds."""
    shapes = gate_shapes(problem.sidecar, device)
    variants = [v for v in GATE_VARIANT_SETS if v in problem.sidecar.variants] or ["base"]
    if variants.count("base") < 2:
        variants = ["base", *variants]
    sets = [{"shape": 0, "seed": secrets.randbits(62), "variant": v} for v in variants]
    sets += [{"shape": s, "seed": secrets.randbits(62), "variant": "base"}
             for s in range(1, len(shapes))]
    timing = [{"shape": 0, "seed": secrets.randbits(62), "variant": "base"} for _ in range(TIMING_SETS)]
    return shapes, sets, timing


def _sandbox_failure(exc: SandboxError, who: str, device: str) -> CheckResult:
    """Map how a candidate's sandbox failed to a verdict: refusals fail, the rest are errors."""
    if exc.rule == "bad_candidate":
        return CheckResult.invalid("bad_candidate", f"{who}: {exc.message}", device)
    if exc.rule in REFUSAL_RULES:
        return CheckResult(verdict="fail", rule=exc.rule, reason=exc.message, evidence=exc.evidence,
                           device=device)
    rule = {"raised": "exception"}.get(exc.kind, exc.kind)
    evidence = {"stderr_tail": exc.detail[-1500:]} if exc.detail else {}
    return CheckResult(verdict="error", rule=rule, reason=f"{who}: {exc.message}",
                       evidence=evidence, device=device)


class Check:
    """The state of one ``kernelab check`` run."""

    def __init__(self, problem: Problem, candidate: Path, device: str, baseline: Path | None,
                 config: Config, progress: Progress | None,
                 early: dict[str, Sandbox] | None = None) -> None:
        self.problem, self.candidate, self.baseline = problem, candidate, baseline
        self.device = device
        self.config = config
        self.progress = progress or (lambda _msg: None)
        self.stages: dict[str, float] = {}
        self.deadline = 0.0
        self.boxes: list[Sandbox] = []
        self._early = dict(early or {})

    def spec(self, label: str) -> SandboxSpec:
        return SandboxSpec.from_config(self.config.sandbox, self.device, label)

    @contextmanager
    def stage(self, name: str, message: str) -> Iterator[None]:
        self.progress(message)
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.stages[name] = round(time.monotonic() - t0, 3)

    # ----- reference --------------------------------------------------------------------
    def validate_reference(self, problem: Problem, ref: RefData, plan: list[dict[str, Any]]) -> list[int]:
        """Indices of usable gate sets; a variant on which even the reference breaks is dropped."""
        usable = []
        for i in range(len(plan)):
            if ref.sets[i]["calib"]["finite"]:
                usable.append(i)
            elif i == 0:
                raise Rejected(CheckResult.invalid(
                    "bad_reference", f"{problem.path}: reference output has NaN/Inf on its own "
                    "inputs", self.device))
        base = [i for i in usable if plan[i]["variant"] == "base" and plan[i]["shape"] == 0]
        why = gate.check_reference([ref.oracle[i] for i in range(len(ref.oracle))], base)
        if why:
            raise Rejected(CheckResult.invalid("bad_reference", f"{problem.path}: {why}", self.device))
        return usable

    # ----- candidate --------------------------------------------------------------------
    def candidate_message(self, box: Sandbox, ref: RefData, n_gate: int, gate_run: bool,
                          path: Path) -> tuple[dict[str, Any], list[torch.Tensor]]:
        tensors = [t for sd in ref.state for t in sd]
        tensors += [t for inputs in ref.inputs for t in inputs]
        msg = {"cmd": "load_candidate", "path": box.stage_file(path, path.name),
               "device": self.device, "target": self.problem.sidecar.target,
               "tf32": self.problem.sidecar.tf32, "gate": gate_run,
               "shapes": ref.shapes, "sets": ref.sets[:n_gate], "timing_sets": ref.sets[n_gate:]}
        return msg, tensors

    def gate_candidate(self, box: Sandbox, ref: RefData, n_gate: int, usable: list[int]) -> tuple[float, float]:
        msg, tensors = self.candidate_message(box, ref, n_gate, True, self.candidate)
        try:
            reply, outs = box.request(msg, tensors, deadline=self.deadline, what="running the candidate")
        except SandboxError as exc:
            raise Rejected(_sandbox_failure(exc, "candidate", self.device)) from None
        reports = reply.get("sets")
        if not isinstance(reports, list) or len(reports) != n_gate:
            raise Rejected(CheckResult(verdict="error", rule="protocol", device=self.device,
                                       reason="candidate sandbox sent a malformed gate report"))
        it = iter(outs)
        per_set = [[next(it, None) for _ in r.get("outputs", [])] for r in reports]
        again = list(it)
        worst_norm, worst_tol = 0.0, None
        tolerances: dict[int, gate.Tolerance] = {}
        target = self.problem.sidecar.target
        for i in usable:
            report, cand = reports[i], self.here(per_set[i])
            tol = self.tolerance(ref, i)
            tolerances[i] = tol
            failure = (gate.check_structure(ref.sets[i]["outputs"], report["outputs"], i)
                       or gate.check_written(report.get("poisoned", []), report["outputs"], i)
                       or gate.check_synchronised(report.get("unsynchronised", []), i)
                       or gate.check_finite(cand, i)
                       or gate.check_inputs_untouched(report.get("mutated", []), i)
                       or gate.check_target_launched(int(report.get("launches", 0)), target, i)
                       or gate.check_no_torch_compute(report.get("torch_ops", {}), i))
            if failure is None:
                failure, outcome = gate.check_numerics(cand, self.here(ref.oracle[i]), tol, i)
                if outcome.norm_error >= worst_norm:
                    worst_norm, worst_tol = outcome.norm_error, tol.norm
            self.fail_if(failure, worst_norm, tol.norm)
        first = self.here(per_set[usable[0]])
        self.fail_if(gate.check_deterministic(first, self.here(again), tolerances[usable[0]]),
                     worst_norm, worst_tol)
        return worst_norm, worst_tol if worst_tol is not None else 0.0

    def here(self, tensors: list[torch.Tensor | None]) -> list[torch.Tensor]:
        """Tensors moved to where comparisons are fastest: the GPU under test, if any.

        This process runs no evaluated code, so using the device here is safe; comparing
        hundreds of megabytes in float64 on the host would dominate a GPU check.
        """
        return [t.to(self.device) for t in tensors if t is not None]

    def tolerance(self, ref: RefData, i: int) -> gate.Tolerance:
        side = self.problem.sidecar
        factor = side.tol_factor or self.config.gate.tol_factor
        return gate.tolerance_for(ref.sets[i]["calib"], factor, side.tolerance)

    def fail_if(self, failure: gate.Failure | None, max_err: float, tol: float | None) -> None:
        if failure is not None:
            raise Rejected(CheckResult(
                verdict="fail", rule=failure.rule, reason=failure.reason, evidence=failure.evidence,
                max_rel_error=failure.evidence.get("max_rel_error", max_err or None),
                tolerance=failure.evidence.get("tolerance", tol), device=self.device))

    # ----- timing -----------------------------------------------------------------------
    def time_against(self, a: Sandbox, b: Sandbox, ref_box: Sandbox, ref: RefData, n_gate: int,
                     result: CheckResult) -> None:
        """Time ``b`` (the candidate) against ``a`` (the reference or the incumbent); the
        reference sandbox ``ref_box`` re-checks outputs sampled from the timed calls."""
        sampler, clock_error = self.clock_sampler(ref.info)
        mode = self.config.timing.lock_clocks
        try:
            with locked_clocks(sampler, mode) if sampler and mode != "off" else nullcontext() as locked:
                meas = Comparison(a, b, self.config.timing, self.device, sampler, self.deadline,
                                  self.progress).run()
        except TimerMismatch as exc:
            raise Rejected(CheckResult(verdict="fail", rule="timer_mismatch", reason=str(exc),
                                       device=self.device)) from None
        except SandboxError as exc:
            raise Rejected(_sandbox_failure(exc, "candidate (while timed)", self.device)) from None
        self.verify_timed(ref_box, meas, ref, n_gate)
        d = meas.decision
        result.reference_ms, result.candidate_ms = meas.a_ms, meas.b_ms
        result.speedup, result.speedup_ci = d.speedup, [d.ci[0], d.ci[1]]
        result.faster_than_noise, result.aa_noise, result.threshold = d.faster, d.aa_noise, d.threshold
        result.blocks = meas.blocks
        result.timed_sets = len(ref.sets) - n_gate
        if self.device != "cpu":
            result.clock = summarise(meas.clock_samples, locked, meas.discarded) if sampler else \
                {"error": clock_error}
            result.clock["timing_mode"] = meas.mode
            result.clock["trusted_ms"] = meas.trusted_ms

    def clock_sampler(self, info: dict[str, Any]) -> tuple[ClockSampler | None, str]:
        """The device's clock sampler, or None and why there is none (reported with the time)."""
        if self.device == "cpu":
            return None, "no GPU"
        try:
            return ClockSampler(str(info.get("uuid", ""))), ""
        except ClockError as exc:
            return None, str(exc)

    def verify_timed(self, ref_box: Sandbox, meas: Any, ref: RefData, n_gate: int) -> None:
        """Outputs produced while timed must be as correct as those produced while gated.

        Samples are drawn at random after the fact, so the candidate cannot know which of its
        timed calls will be checked; the reference sandbox recomputes their float64 oracle on
        the same perturbed inputs and fingerprints it with the same weights.
        """
        chosen = sorted(secrets.SystemRandom().sample(sorted(meas.fingerprints),
                                                      min(SPOT_CHECKS, len(meas.fingerprints))))
        try:
            reply, _ = ref_box.request({"cmd": "oracle_fingerprints", "samples": chosen, **meas.seeds},
                                       deadline=self.deadline, what="recomputing timed outputs")
        except SandboxError as exc:
            raise Rejected(CheckResult(verdict="error", rule="bad_reference", device=self.device,
                                       reason=f"reference while re-checking: {exc.message}")) from None
        n_sets = len(ref.sets) - n_gate
        for s, expected in zip(chosen, reply["samples"], strict=True):
            tol = self.tolerance(ref, n_gate + s % n_sets)
            self.fail_if(gate.check_fingerprints(meas.fingerprints[s], expected, tol, s), 0.0, None)

    # ----- the whole check --------------------------------------------------------------
    def run(self, time_it: bool) -> CheckResult:
        try:
            return self._checked(time_it)
        finally:
            self.close_early()

    def _checked(self, time_it: bool) -> CheckResult:
        self.deadline = time.monotonic() + self.config.gate.timeout_s
        try:
            if self.problem.sidecar.target in GPU_ONLY_TARGETS and self.device == "cpu":
                return CheckResult.invalid("bad_arguments", needs_gpu(self.problem, self.candidate),
                                           self.device)
            load_candidate(self.candidate)
            if self.baseline is not None:
                load_candidate(self.baseline)
        except ProblemError as exc:
            return CheckResult.invalid("bad_candidate", str(exc), self.device)
        make_undumpable()
        try:
            return self._run(time_it)
        except Rejected as rej:
            rej.result.stages = self.stages
            return rej.result

    def close_early(self) -> None:
        """Sandboxes given a head start that the check did not use (it ended before them)."""
        for box in self._early.values():
            box.close()
        self._early.clear()

    def _run(self, time_it: bool) -> CheckResult:
        if self.device != "cpu":   # our CUDA context, for comparisons, while the sandboxes start
            threading.Thread(target=torch.cuda.init, daemon=True).start()
        with ExitStack() as stack:
            ref_box = self.open_box(stack, "reference")
            # Started now so that its interpreter, torch, CUDA context and Triton's driver
            # stubs come up while the reference runs.
            cand_box = self.open_box(stack, "candidate")
            with self.stage("reference", "running the reference and the float64 oracle"):
                shapes, sets, timing = plan_sets(self.problem, self.device)
                ref = self.load_reference_planned(ref_box, shapes, sets, timing)
                n_gate = len(sets)
                usable = self.validate_reference(self.problem, ref, sets)
            with self.stage("gate", "gating the candidate"):
                max_err, tol = self.gate_candidate(cand_box, ref, n_gate, usable)
            result = CheckResult(verdict="pass", max_rel_error=max_err, tolerance=tol,
                                 device=self.device, input_sets=len(usable),
                                 baseline=str(self.baseline) if self.baseline else "reference")
            if time_it:
                a_box = ref_box if self.baseline is None else self.start_baseline(stack, ref, n_gate)
                with self.stage("timing", "timing against the baseline"):
                    self.time_against(a_box, cand_box, ref_box, ref, n_gate, result)
        result.stages = self.stages
        return result

    def load_reference_planned(self, box: Sandbox, shapes: list[dict[str, Any]],
                               sets: list[dict[str, Any]], timing: list[dict[str, Any]]) -> RefData:
        path = box.stage_file(self.problem.path, self.problem.path.name)
        msg = {"cmd": "load_reference", "path": path, "device": self.device,
               "tf32": self.problem.sidecar.tf32, "shapes": shapes, "sets": sets,
               "timing_sets": timing, "param_seeds": [secrets.randbits(62) for _ in shapes]}
        try:
            reply, tensors = box.request(msg, deadline=self.deadline, what="running the reference")
        except SandboxError as exc:
            result = CheckResult.invalid("bad_reference", f"{self.problem.path}: {exc.message}",
                                         self.device)
            result.evidence = {"stderr_tail": exc.detail[-3000:]} if exc.detail else {}
            raise Rejected(result) from None
        return split_reference(reply, tensors, sets + timing, len(sets))

    def open_box(self, stack: ExitStack, label: str) -> Sandbox:
        """A started sandbox (the one given a head start, if its device matches), closed with
        the stack; on the way out every sandbox is signalled before any is waited for, so their
        CUDA contexts are torn down in parallel."""
        early = self._early.pop(label, None)
        if early is not None and early.spec == self.spec(label):
            box = early
            stack.callback(box.close)
        else:
            if early is not None:
                early.close()
            box = stack.enter_context(Sandbox(self.spec(label)))
        self.boxes.append(box)
        stack.callback(self._kill_all)
        return box

    def _kill_all(self) -> None:
        for box in self.boxes:
            box.kill()

    def start_baseline(self, stack: ExitStack, ref: RefData, n_gate: int) -> Sandbox:
        assert self.baseline is not None
        box = self.open_box(stack, "baseline")
        msg, tensors = self.candidate_message(box, ref, n_gate, False, self.baseline)
        try:
            box.request(msg, tensors, deadline=self.deadline, what="loading the baseline")
        except SandboxError as exc:
            raise Rejected(CheckResult(verdict="error", rule="baseline", device=self.device,
                                       reason=f"baseline {self.baseline}: {exc.message}")) from None
        return box


def split_reference(reply: dict[str, Any], tensors: list[torch.Tensor],
                    plan: list[dict[str, Any]], n_gate: int) -> RefData:
    """Cut the reference sandbox's flat tensor list back into per-shape and per-set pieces
    (timing sets come without an oracle: their samples are re-checked in the sandbox)."""
    it = iter(tensors)
    shapes = reply["shapes"]
    state = [[next(it) for _ in s["state_keys"]] for s in shapes]
    inputs, oracle = [], []
    for i, entry in enumerate(reply["sets"]):
        inputs.append([next(it) for k in entry["kinds"] if k == "tensor"])
        oracle.append([next(it) for _ in range(entry["n_outputs"])] if i < n_gate else [])
    sets = [dict(entry, shape=p["shape"]) for entry, p in zip(reply["sets"], plan, strict=True)]
    return RefData(shapes=shapes, state=state, sets=sets, inputs=inputs,
                   oracle=oracle, info=reply.get("info", {}))


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
    try:
        device = normalise_device(device)
    except ProblemError as exc:
        return _refused(early, CheckResult.invalid("bad_arguments", str(exc), device))
    try:
        problem = load_problem(reference)
    except ProblemError as exc:
        result = _refused(early, CheckResult.invalid("bad_reference", str(exc), device))
    else:
        check = Check(problem, Path(candidate), device, Path(baseline) if baseline else None,
                      config, progress, early)
        result = check.run(time_it)
    result.wall_s = round(time.monotonic() - t0, 3)
    return result


def _refused(early: dict[str, Sandbox] | None, result: CheckResult) -> CheckResult:
    """A check refused before it starts: the sandboxes given a head start are closed unused."""
    for box in (early or {}).values():
        box.close()
    return result
