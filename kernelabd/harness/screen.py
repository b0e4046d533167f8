"""Screening: many configurations of one candidate compiled in parallel, checked against the
SM's limits and timed briefly in one sandbox, so that only the best few go on to the full gate
and the interleaved A/B (``kernelabd.harness.child.screen`` runs inside the sandbox).

A screened time is never a result: it is measured in a process that also runs the variants'
code, so it only orders configurations. Whatever the sandbox replies is read as untrusted
input (a status outside the known ones is ``failed``), and what it picks still has to pass the
gate against the float64 oracle and win its A/B in fresh sandboxes before anything is kept.

A variant that kills the sandbox (a crash, an illegal address, a hang past its deadline) is
recorded as ``failed`` with the cause, and the variants not yet timed are screened again in a
fresh sandbox, a bounded number of times.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kernelabd.harness.problem import load_problem
from kernelabd.harness.sandbox import Sandbox, SandboxError, SandboxSpec

CHILD = "kernelabd.harness.child.screen"
STATUSES = ("timed", "spills", "too_big", "failed", "wrong")
COMPILE_TIMEOUT_S = 900.0   # a whole batch's compiles (a large GEMM compiles in ~10 s a core)
MIN_COMPILE_S = 20.0
"""The least a batch's compiles are given, whatever its job has left: on the H200 a batch of 33
compiled in 2-6 s, a job's first (its processes starting) in 17-27 s; past it, a variant still
compiling is dropped (``child.screen.Screen.compile_all``)."""
TIME_TIMEOUT_S = 120.0      # one variant: load (a compile if the cache missed), check, time
RESTARTS = 2                # fresh sandboxes after one died, per batch


@dataclass(frozen=True)
class Options:
    """How a batch is screened ([search] in ``kernelab.toml``)."""

    screen_ms: float = 5.0
    workers: int = 0            # compile-only processes; 0: one a core of this host
    arch: str | None = None     # compile for this arch and drop spills; None: the GPU's own
                                # (none on a CPU, whose interpreter has no registers)


@dataclass(frozen=True)
class Screened:
    """One configuration's screening: ``timed`` (with its ms), or why it was dropped."""

    params: dict[str, Any]
    status: str
    ms: float | None = None
    registers: int | None = None
    spills: int | None = None
    detail: str | None = None


def host_cores() -> int:
    """Cores this process may run on (the sandbox's compile-only processes use them all)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class Screener:
    """One job's screening sandbox, kept from batch to batch: its interpreter, CUDA context,
    reference (inputs, weights, fp32 outputs), compile-only processes and Triton cache are built
    once, and each batch only compiles and times its variants. A sandbox that died is replaced
    by a fresh one on the next use."""

    def __init__(self, reference: Path, spec: SandboxSpec, options: Options = Options()) -> None:
        self.reference = reference
        self.spec = replace(spec, module=CHILD, label="screen")
        self.options = options
        self.box: Sandbox | None = None
        self.staged_reference = ""
        self.written = 0            # variant files written into the sandbox so far (unique names)
        self.warmed: dict[str, Any] | None = None   # the sandbox's account of ``warm``, once done
        self.ready_s: float | None = None           # seconds the last batch waited for the sandbox
        self.started_s: float | None = None         # … for its reference and compile processes
        self.compile_s: float | None = None         # … for its compiles
        self.batches = 0
        self._lock = threading.Lock()               # one request at a time: ``warm`` runs in a thread
        self._warming: threading.Thread | None = None

    def screen(self, variants: list[tuple[dict[str, Any], str]],
               compile_s: float = COMPILE_TIMEOUT_S) -> list[Screened]:
        """Screen each ``(params, source)`` variant of one candidate; one result per variant,
        in order (after a ``prewarm`` still under way has ended). A variant whose compile has
        not ended ``compile_s`` (at least ``MIN_COMPILE_S``) after the batch's compiles began
        is ``failed``."""
        budget_s = min(COMPILE_TIMEOUT_S, max(MIN_COMPILE_S, compile_s))
        waited = time.monotonic()
        with self._lock:
            self.ready_s = time.monotonic() - waited
            self.batches += 1
            found: dict[int, Screened] = {}
            left = list(range(len(variants)))
            for _ in range(RESTARTS + 1):
                if not left:
                    break
                left = self._in_sandbox(variants, left, found, budget_s)
            for i in left:
                found[i] = Screened(variants[i][0], "failed", detail="not screened: the screening sandbox kept dying")
            return [found[i] for i in range(len(variants))]

    def costs(self) -> str:
        """Where the last batch's wall went before timing, as the batch's event says it: the
        wait for a ``prewarm`` under way, the sandbox's own start, the compiles (the sandbox's
        figures: for reading only)."""
        parts = [f"{label} {value:.1f} s" for label, value in
                 (("waited for the sandbox", self.ready_s), ("its start", self.started_s),
                  ("compiles", self.compile_s)) if value is not None]
        ahead = " (sandbox started ahead)" if self.warmed is not None and self.batches == 1 else ""
        return f"; {', '.join(parts)}{ahead}" if parts else ""

    def prewarm(self, reference_bytes: int) -> None:
        """Start the sandbox here, and its compile-only processes from a thread of this process,
        so that the first batch finds them ready; host work only, nothing is launched on the
        device. The process is started by the caller, whose thread outlives it (a sandbox dies
        with the thread that started it); only the slow part, its warm-up, is in the background.
        A failure is left for the first batch to meet (it starts a fresh sandbox)."""
        if self._warming is not None or self.box is not None:
            return
        try:
            with self._lock:
                box = self._sandbox()
        except (SandboxError, OSError):
            self._close()
            return
        self._warming = threading.Thread(target=self._warm, args=(box, reference_bytes), daemon=True,
                                         name="kernelab-screen-warm")
        self._warming.start()

    def _warm(self, box: Sandbox, reference_bytes: int) -> None:
        with self._lock:
            try:
                reply, _ = box.request({**_start_fields(self.reference, self.staged_reference, self.spec.device,
                                                        self.options),
                                        "cmd": "warm", "reference_bytes": reference_bytes},
                                       deadline=time.monotonic() + COMPILE_TIMEOUT_S,
                                       what="starting the compile-only processes")
                self.warmed = reply
            except (SandboxError, OSError):     # a sandbox that did not start: the first batch retries
                self._close()

    def close(self) -> None:
        """End the sandbox; a ``prewarm`` still under way is cut short, its sandbox killed."""
        while self._warming is not None and self._warming.is_alive():
            if self.box is not None:
                self.box.kill()         # its request then fails, and the thread ends
            self._warming.join(timeout=1.0)
        self._close()

    def _close(self) -> None:
        if self.box is not None:
            self.box.close()
            self.box = None

    def __enter__(self) -> Screener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _sandbox(self) -> Sandbox:
        if self.box is None:
            self.box = Sandbox(self.spec)
            self.box.start()
            self.staged_reference = self.box.stage_file(self.reference, self.reference.name)
            sidecar = self.reference.with_suffix(".toml")
            if sidecar.is_file():
                self.box.stage_file(sidecar, sidecar.name)
        return self.box

    def _in_sandbox(self, variants: list[tuple[dict[str, Any], str]], left: list[int],
                    found: dict[int, Screened], budget_s: float) -> list[int]:
        """Screen the ``left`` variants in the sandbox, filling ``found``; the ones still to do
        when it died (empty when it did not: it is then kept for the next batch)."""
        box = self._sandbox()
        staged = {i: self._write(box, variants[i][1]) for i in left}
        try:
            reply, _ = box.request({**_prepare(self.reference, self.staged_reference, staged, self.spec.device,
                                               self.options), "compile_s": budget_s},
                                   deadline=time.monotonic() + COMPILE_TIMEOUT_S,
                                   what="compiling the screened configurations")
        except SandboxError as exc:
            for i in left:
                found[i] = Screened(variants[i][0], "failed", detail=exc.message)
            self._close()
            return []
        self.started_s, self.compile_s = _number(reply.get("ready_s")), _number(reply.get("compile_s"))
        compiled = {int(c.get("index", -1)): c for c in reply.get("compiled") or [] if isinstance(c, dict)}
        survivors = []
        for i in left:
            entry = compiled.get(i, {"status": "failed", "detail": "the sandbox did not compile it"})
            if entry.get("status") == "ok":
                survivors.append(i)
            else:
                found[i] = _result(variants[i][0], entry)
        for k, i in enumerate(survivors):
            try:
                timed, _ = box.request({"cmd": "time", "index": i, "path": staged[i]},
                                       deadline=time.monotonic() + TIME_TIMEOUT_S, what="timing a configuration")
            except SandboxError as exc:
                found[i] = Screened(variants[i][0], "failed", detail=exc.message)
                if exc.kind == "raised":
                    continue
                self._close()
                return survivors[k + 1:]
            found[i] = _result(variants[i][0], {**compiled[i], **timed})
        return []

    def _write(self, box: Sandbox, source: str) -> str:
        """Write one variant into the sandbox, read-only: the sandbox reads its copy, never ours."""
        self.written += 1
        path = box.workdir / f"variant_{self.written}.py"
        path.write_text(source)
        path.chmod(0o444)
        return str(path)


def screen(reference: Path, variants: list[tuple[dict[str, Any], str]], spec: SandboxSpec,
           options: Options = Options()) -> list[Screened]:
    """One batch screened in a sandbox of its own."""
    with Screener(reference, spec, options) as screener:
        return screener.screen(variants)


def _start_fields(reference: Path, staged_reference: str, device: str, options: Options) -> dict[str, Any]:
    """What the sandbox needs to build the reference and start its compile-only processes."""
    problem = load_problem(reference)
    return {"reference": staged_reference, "constants": problem.sidecar.constants_for(device),
            "tf32": problem.sidecar.tf32, "device": device, "arch": options.arch, "screen_ms": options.screen_ms,
            "workers": options.workers or host_cores()}


def _prepare(reference: Path, staged_reference: str, staged: dict[int, str], device: str,
             options: Options) -> dict[str, Any]:
    return {**_start_fields(reference, staged_reference, device, options), "cmd": "prepare",
            "variants": [{"index": i, "path": path} for i, path in staged.items()]}


def _result(params: dict[str, Any], entry: dict[str, Any]) -> Screened:
    """The sandbox's account of one variant, read as untrusted input."""
    status = entry.get("status") if entry.get("status") in STATUSES else "failed"
    ms = _number(entry.get("ms"))
    if status == "timed" and (ms is None or ms <= 0):
        status, ms = "failed", None
    detail = entry.get("detail")
    return Screened(params, status, ms if status == "timed" else None, _count(entry.get("registers")),
                    _count(entry.get("spills")), str(detail)[:500] if detail else None)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
