"""The loop's side of screening: a proposer's ``Batch`` screened, every configuration recorded,
and the best few handed to the full gate and A/B as ordinary candidates.

A batch holds configurations of the incumbent's ``TUNABLES``. The incumbent's own configuration
is screened with them as the control, in the same sandbox. Each configuration is recorded in
``screened`` with its status and time (never a result: the TUI shows the rows, ``report.json``
counts them). The fastest that beat the control, ``[search] contenders`` of them, become
candidates whose edit names their change from the incumbent, and go through ``Loop.record`` and
``Loop.evaluate`` like any other: the gate against the float64 oracle, then the interleaved A/B
against the incumbent. The first one accepted ends the batch (the rest were screened against
an incumbent that is no longer the one to beat).

The per-device tuning cache keeps the best configuration found for a kernel at its sizes: each
accepted candidate with declared tunables is offered to it (``cache_best`` keeps the faster), and
the next job with the same kernel on a device of the same name starts its search there.
"""

from __future__ import annotations

import ast
import json
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kernelabd.harness.problem import Sidecar
from kernelabd.harness.sandbox import SandboxSpec
from kernelabd.harness.screen import Options, Screened, Screener
from kernelabd.propose.base import Batch, Candidate, JobContext, Proposal
from kernelabd.propose.base import Screened as ScreenedRow
from kernelabd.propose.tune import (
    Target,
    TunablesError,
    describe_change,
    fits,
    params_of,
    resources_of,
    signature,
    with_params,
)
from kernelabd.pysource import parse

if TYPE_CHECKING:
    from kernelabd.service.converge import Loop

LITERAL_SIZES = (int, float, bool, str, tuple, list)
_SCREENERS: dict[int, Screener] = {}     # job id -> its screening sandbox, kept between batches


def search_context(loop: Loop, ctx: JobContext) -> JobContext:
    """``ctx`` with what a model-based tuner needs: the job's screened rows, the tuning cache's
    entries for the incumbent's kernel, and how large a batch this job may screen."""
    batch = loop.config.search.batch if screens(loop, ctx.sidecar.target) else 0
    return replace(ctx, screened=tuple(ScreenedRow.from_row(r) for r in loop.rec.screened(loop.job_id)),
                   cached=tuple(cached_for(loop, ctx.incumbent)), screen_batch=batch)


def screens(loop: Loop, target: str) -> bool:
    """Whether this job screens batches: a Triton target, a GPU (or a CPU job told to), and a
    memory plan with room for the screening sandbox."""
    plan = loop.session.plan if loop.session is not None else None
    return (target == "triton" and (loop.device != "cpu" or loop.config.search.on_cpu)
            and (plan is None or plan.screening) and loop.config.search.batch > 0)


def prestart(loop: Loop) -> None:
    """Start the job's screening sandbox and its compile-only processes in the background as
    soon as the reference's session is open, where the tuner will screen. Started once the first
    candidate was done, the first batch still waited 10.3-15.9 s for it on an H200 (bench/screen,
    2026-12-04, no peers to hide it behind), charged to the job; the proposers' first candidate
    takes longer than that, and the compile processes run at a lower priority than the rest."""
    if loop.job_id in _SCREENERS or "tune" not in loop.limits.proposers \
            or not screens(loop, loop.problem.sidecar.target):
        return
    plan = loop.session.plan if loop.session is not None else None
    sizes = plan.bytes if plan is not None else {}
    screener_for(loop).prewarm(int(sizes.get("inputs", 0)) + int(sizes.get("parameters", 0)))


def cached_for(loop: Loop, incumbent: Candidate | None) -> list[dict[str, Any]]:
    """The cache's best configurations for the incumbent's kernel on this device's model."""
    if incumbent is None:
        return []
    try:
        kernel = signature(incumbent.source)
    except TunablesError:
        return []
    return loop.rec.cached_configs(device_name(loop.device), kernel, kernel.split("@")[0], sizes_of(loop))


def device_name(device: str) -> str:
    """The device's model name (``NVIDIA H200``): the cache holds across devices of one model."""
    import torch

    from kernelabd.service.ceilings import device_name as name_of

    return name_of(torch.device(device))


def sizes_of(loop: Loop) -> str:
    return problem_sizes(loop.job["source"], loop.problem.sidecar, loop.device)


def problem_sizes(reference_source: str, sidecar: Sidecar, device: str) -> str:
    """The problem's sizes as the cache keys them (JSON): the reference's module-level literal
    constants (KernelBench's ``batch_size``, ``dim``…) with the sidecar's for this device over
    them. Read from the source, nothing run."""
    found: dict[str, Any] = {}
    for node in parse(reference_source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            if isinstance(value, LITERAL_SIZES):
                found[node.targets[0].id] = value
    return json.dumps({**found, **sidecar.constants_for(device)}, sort_keys=True)


def options(loop: Loop) -> Options:
    search = loop.config.search
    arch = (search.cpu_arch or None) if loop.device == "cpu" else None
    return Options(screen_ms=search.screen_ms, workers=search.compile_workers, arch=arch)


def screen_batch(loop: Loop, batch: Batch, proposer: str) -> None:
    """Screen ``batch`` with its parent's configuration as the control, record every row, and
    gate and A/B the best few that beat the control, until one is accepted."""
    started = time.monotonic()
    parent = next(c for c in loop.history if c.id == batch.parent_id)
    remember(loop, parent)
    control = params_of(parent.source) or {}
    configs = _unique([control, *({**control, **c} for c in batch.configs)])
    results = screen_configs(loop, batch.source, configs)
    ids = loop.rec.add_screened(loop.job_id, [_row(batch.parent_id, proposer, r, r.params == control)
                                              for r in results])
    seconds = time.monotonic() - started
    loop.charge(seconds)
    picked = contenders(list(zip(ids, results, strict=True)), control, loop.config.search.contenders,
                        loop.config.timing.min_gain)
    loop.rec.event("batch.screened", f"{summary(parent, results, control, picked)}"
                   f"{screener_for(loop).costs()} ({seconds:.1f} s)", job_id=loop.job_id)
    loop.progress(f"screened {len(results)} configurations of #{parent.id}; {len(picked)} go on to the gate")
    for screened_id, result in picked:
        if _should_stop(loop):
            return
        cand = loop.record(Proposal(source=with_params(batch.source, result.params),
                                    edit=edit_line(control, result, results[0]), parent_id=batch.parent_id,
                                    params=result.params, language=batch.language), proposer)
        loop.rec.link_screened(screened_id, cand.id)
        loop.evaluate(cand, compiled_in=screener_for(loop).box)
        done = next(c for c in loop.history if c.id == cand.id)
        if done.accepted:
            remember(loop, done)
            return


def screen_configs(loop: Loop, source: str, configs: list[dict[str, Any]]) -> list[Screened]:
    """Each configuration screened, in order: those the tuner's estimate says cannot fit
    (``tune.fits``) are recorded ``too_big`` without compiling; the rest go to the sandbox."""
    resources, target = resources_of(source), Target.on(loop.device, loop.job.get("capture"))
    fitting = [p for p in configs if fits(p, resources, target)]
    left_s = loop.limits.max_minutes * 60 - loop.active_s
    screened = iter(screener_for(loop).screen([(p, with_params(source, p)) for p in fitting], compile_s=left_s))
    return [next(screened) if p in fitting else
            Screened(p, "too_big", detail="pruned before compiling: its declared tiles exceed the "
                     "shared memory or registers of a program") for p in configs]


def screener_for(loop: Loop) -> Screener:
    """The job's screening sandbox, started on its first batch and kept until the job ends."""
    if loop.job_id not in _SCREENERS:
        spec = SandboxSpec.from_config(loop.config.sandbox, loop.device, "screen")
        _SCREENERS[loop.job_id] = Screener(loop.reference, spec, options(loop))
    return _SCREENERS[loop.job_id]


def close(loop: Loop) -> None:
    """End the job's screening sandbox (and its compile-only processes), if it has one."""
    screener = _SCREENERS.pop(loop.job_id, None)
    if screener is not None:
        screener.close()


def contenders(rows: list[tuple[int, Screened]], control: dict[str, Any], keep: int,
               min_gain: float = 0.0) -> list[tuple[int, Screened]]:
    """The ``keep`` fastest timed configurations that beat the control's screened time by more
    than ``min_gain`` (the A/B's least gain: anything closer would not be kept; the fastest of
    all when the control itself could not be timed: the A/B decides)."""
    control_ms = next((r.ms for _, r in rows if r.params == control and r.status == "timed"), None)
    timed = [(i, r) for i, r in rows if r.status == "timed" and r.params != control and r.ms is not None]
    if control_ms is not None:
        timed = [(i, r) for i, r in timed if r.ms is not None and r.ms * (1 + min_gain) < control_ms]
    return sorted(timed, key=lambda item: item[1].ms or 0.0)[:max(0, keep)]


def edit_line(control: dict[str, Any], result: Screened, control_result: Screened) -> str:
    """The candidate's one named change: its configuration's change from the incumbent's."""
    change = describe_change(control, result.params)
    if control_result.status == "timed" and control_result.ms and result.ms:
        return f"{change} (screened at {result.ms / control_result.ms:.3f}× the incumbent's time)"
    return f"{change} (screened at {result.ms:.4g} ms)"


def summary(parent: Candidate, results: list[Screened], control: dict[str, Any],
            picked: list[tuple[int, Screened]]) -> str:
    """One line for the job's events: how many of each status, the best against the control."""
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    line = f"#{parent.id}: {len(results)} configurations ({', '.join(f'{n} {s}' for s, n in counts.items())})"
    control_ms = results[0].ms if results and results[0].params == control else None
    timed = [r for r in results if r.status == "timed" and r.ms]
    if timed and control_ms:
        best = min(timed, key=lambda r: r.ms or 0.0)
        line += f"; best {best.ms / control_ms:.3f}× the incumbent's screened {control_ms:.4g} ms"
    return f"{line}; {len(picked)} to the gate"


def remember(loop: Loop, cand: Candidate) -> None:
    """Offer an accepted candidate's configuration to the per-device tuning cache."""
    if not cand.accepted or cand.candidate_ms is None or not cand.params:
        return
    try:
        kernel = signature(cand.source)
    except TunablesError:
        return
    loop.rec.cache_best({"device_name": device_name(loop.device), "signature": kernel, "shapes": sizes_of(loop),
                         "params": cand.params, "ms": cand.candidate_ms, "job_id": loop.job_id})


def _should_stop(loop: Loop) -> bool:
    from kernelabd.service.converge import stop_reason

    return stop_reason(loop.limits, loop.history, loop.active_s, loop.job.get("sol_ms"), loop.next_cost()) is not None


def _row(parent_id: int, proposer: str, result: Screened, is_control: bool) -> dict[str, Any]:
    detail = result.detail
    if is_control:
        detail = "control: the incumbent's configuration" + (f"; {detail}" if detail else "")
    return {"parent_id": parent_id, "proposer": proposer, "params": result.params, "status": result.status,
            "ms": result.ms, "registers": result.registers, "spills": result.spills, "detail": detail}


def _unique(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    for c in configs:
        if c not in seen:
            seen.append(c)
    return seen
