"""``results/NAME/``: the best candidate as a drop-in ``best.py`` and an honest report
(``report.md`` and ``report.json``) of how it was found.

Files are rewritten on every acceptance and when the job ends, each through a temporary file and
``rename``, so a reader (or a crash) never sees half a report. A job never overwrites the
results of a newer job for the same problem name.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from store.home import Home
from store.records import Store
from store.status import (
    PEER_LABELS,
    chain_speedup,
    describe_peers,
    describe_plan,
    loads,
    screened_count,
    speedup_vs_best_peer,
)

STAGES = ("sandbox_start", "cache_carry", "reference", "gate", "gate_first_call", "timing", "fingerprint")
"""The stages an evaluation records wall seconds for (``CheckResult.stages``), in the order they
run; a stage that did not run is absent, and one not named here is listed after these.
``cache_carry`` is the part of ``sandbox_start`` that copied a screened winner's compiled
kernels from the screening sandbox; ``gate_first_call`` is the part of ``gate`` its first gated
call took (where the candidate's kernels are compiled, or loaded from that copy);
``fingerprint`` runs beside the others, in a sandbox of its own."""


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def lineage(candidates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The accepted edits in order, each with the speedup it was accepted on."""
    steps = []
    for c in candidates:
        if not c["accepted"]:
            continue
        steps.append({"candidate": c["id"], "parent": c["parent_id"], "proposer": c["proposer"],
                      "edit": c["edit"], "candidate_ms": c["candidate_ms"],
                      "baseline_ms": c["baseline_ms"], "speedup": c["speedup"],
                      "speedup_ci": [c["speedup_lo"], c["speedup_hi"]]})
    return steps


def build_report(job: dict[str, Any], candidates: list[dict[str, Any]],
                 screened: int = 0) -> dict[str, Any]:
    """The report's content; every number comes from a recorded measurement, and the derived
    ones (speedups) from ``store.status``, as ``kernelab status`` and the TUI show them."""
    steps = lineage(candidates)
    best = next((c for c in candidates if c["id"] == job["best_candidate_id"]), None)
    result = json.loads(best["result"]) if best and best["result"] else {}
    rules: dict[str, int] = {}
    for c in candidates:
        if c["verdict"] in ("fail", "error"):
            rules[c["rule"] or c["verdict"]] = rules.get(c["rule"] or c["verdict"], 0) + 1
    speedup = chain_speedup(s["speedup"] for s in steps) if best else None
    peers, plan = (_object(job.get(key)) for key in ("peers", "plan"))
    sol_ms = job.get("sol_ms")
    stages = evaluation_stages(candidates)
    return {
        "job": job["id"], "problem": f"{job['problem_name']}.py", "revision": job["revision"],
        "kind": job["kind"], "state": job["state"], "stop_reason": job["stop_reason"],
        "error": job["error"], "device": job["device"], "node": job.get("node"),
        "reference_ms": job["reference_ms"], "reference_noise": job["reference_noise"],
        "speed_of_light": _speed_of_light(job),
        "peers": peers, "speedup_vs_best_peer": speedup_vs_best_peer(speedup, peers),
        "plan": plan,
        "best": None if best is None else {
            "candidate": best["id"], "ms": best["candidate_ms"],
            "fraction_of_speed_of_light": (sol_ms / best["candidate_ms"]
                                           if sol_ms and best["candidate_ms"] else None),
            "speedup_vs_reference": speedup,
            # Each step's CI was measured against the step before; their product bounds the
            # total conservatively rather than being a CI of its own.
            "speedup_ci_vs_reference": [chain_speedup(s["speedup_ci"][0] for s in steps),
                                        chain_speedup(s["speedup_ci"][1] for s in steps)],
            "last_step_speedup_ci": [best["speedup_lo"], best["speedup_hi"]],
            "max_rel_error": best["max_rel_error"], "tolerance": best["tolerance"],
            "clock": result.get("clock"), "device": result.get("device", job["device"]),
            "aa_noise": result.get("aa_noise"), "threshold": result.get("threshold"),
        },
        "lineage": steps,
        "candidates": len(candidates), "accepted": len(steps), "screened": screened,
        "gate_failures": sum(rules.values()), "gate_failures_by_rule": rules,
        "stages": stages, "stages_median": median_stages(stages),
        "active_s": job.get("active_s"), "generated_at": time.time(),
    }


def _object(text: str | None) -> dict[str, Any] | None:
    """A JSON object column (``jobs.peers``, ``jobs.plan``); None when absent or not an object."""
    value = loads(text)
    return value if isinstance(value, dict) else None


def evaluation_stages(candidates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each evaluated candidate's wall seconds per stage (what a candidate costs), from its
    recorded result; candidates recorded without stages are left out."""
    out = []
    for c in candidates:
        result = loads(c.get("result")) or {}
        recorded = result.get("stages") if isinstance(result, dict) else None
        if not isinstance(recorded, dict) or not recorded:
            continue
        seconds = {name: recorded[name] for name in _stage_order(recorded)
                   if isinstance(recorded[name], int | float)}
        out.append({"candidate": c["id"], "verdict": c["verdict"], "seconds": seconds,
                    "wall_s": result.get("wall_s")})
    return out


def median_stages(stages: list[dict[str, Any]]) -> dict[str, float]:
    """The median wall seconds of each stage over the evaluations that ran it."""
    per: dict[str, list[float]] = {}
    for entry in stages:
        for name, value in entry["seconds"].items():
            per.setdefault(name, []).append(float(value))
    return {name: statistics.median(per[name]) for name in _stage_order(per)}


def _stage_order(names: dict[str, Any]) -> list[str]:
    return [n for n in STAGES if n in names] + sorted(n for n in names if n not in STAGES)


def _speed_of_light(job: dict[str, Any]) -> dict[str, Any] | None:
    """The job's floor and what bounds it, from its capture (None before ceilings exist)."""
    capture = job.get("capture")
    if isinstance(capture, str):
        capture = json.loads(capture)
    floor = (capture or {}).get("sol")
    if not job.get("sol_ms") or not isinstance(floor, dict):
        return None
    return {"ms": job["sol_ms"], "bound": floor.get("bound"), "memory_ms": floor.get("memory_ms"),
            "compute_ms": floor.get("compute_ms")}


def _fmt(value: Any, spec: str = ".4g") -> str:
    return "—" if value is None else format(value, spec)


def render_markdown(report: dict[str, Any]) -> str:
    best = report["best"]
    lines = [f"# {report['problem']} (revision {report['revision']}, job {report['job']})", "",
             f"- State: **{report['state']}**" + (f" — {report['stop_reason']}"
                                                   if report["stop_reason"] else ""),
             f"- Device: {report['device'] or '—'}"
             + (f" on node {report['node']}" if report.get("node") else ""),
             f"- Reference: {_fmt(report['reference_ms'])} ms "
             f"(A/A noise {_fmt(report['reference_noise'], '.2%')})"]
    peers = describe_peers(report.get("peers"))
    if peers:
        lines.append(f"- Peers (what the user already has, timed in interleaved A/B): {peers}")
    sol = report["speed_of_light"]
    if sol:
        reached = best and best["fraction_of_speed_of_light"]
        lines.append(f"- Speed of light: {_fmt(sol['ms'])} ms ({sol['bound']}-bound, from this "
                     "device's measured ceilings)"
                     + (f"; the best reaches {_fmt(reached, '.0%')} of it" if reached else ""))
    plan = describe_plan(report.get("plan"))
    if plan:
        lines.append(f"- Memory plan: {plan[0].removeprefix('memory plan: ')}")
        lines += [f"  - {line}" for line in plan[1:]]
    if report["error"]:
        lines.append(f"- Error: {report['error']}")
    if best is None:
        lines += ["", "No candidate passed the gate; there is no best file."]
    else:
        lines += _best_lines(report, best)
    lines += ["", f"{report['candidates']} candidates, {report['accepted']} accepted, "
              f"{report['gate_failures']} rejected by the gate "
              f"{json.dumps(report['gate_failures_by_rule']) if report['gate_failures'] else ''}"]
    if report.get("screened"):
        lines.append(f"{report['screened']} configurations screened (a screened time only picks "
                     "what goes on to the gate and the A/B; it is never a result)")
    lines += ["", "## Lineage of accepted edits", "",
              "| # | parent | proposer | edit | ms | speedup | CI |",
              "|---|---|---|---|---|---|---|"]
    for s in report["lineage"]:
        lo, hi = s["speedup_ci"]
        lines.append(f"| {s['candidate']} | {s['parent'] or '—'} | {s['proposer']} | "
                     f"{s['edit'] or '—'} | {_fmt(s['candidate_ms'])} | "
                     f"{_fmt(s['speedup'], '.3f')} | [{_fmt(lo, '.3f')}, {_fmt(hi, '.3f')}] |")
    lines += ["", "Each step's speedup was measured in interleaved A/B blocks against the step "
              "before it (the first against the reference).", ""]
    return "\n".join(lines + _stage_lines(report))


def _best_lines(report: dict[str, Any], best: dict[str, Any]) -> list[str]:
    lo, hi = best["speedup_ci_vs_reference"]
    peer = report.get("speedup_vs_best_peer")
    label = PEER_LABELS.get((report.get("peers") or {}).get("best"), "")
    versus = (f", **{_fmt(peer, '.3f')}×** the best peer" + (f" ({label})" if label else "")
              if peer is not None else "")
    return [f"- Best: candidate #{best['candidate']}, {_fmt(best['ms'])} ms, "
            f"**{_fmt(best['speedup_vs_reference'], '.3f')}×** the reference{versus} "
            f"(product of step CIs [{_fmt(lo, '.3f')}, {_fmt(hi, '.3f')}])",
            f"- Error vs float64 oracle: {_fmt(best['max_rel_error'], '.3g')} "
            f"(tolerance {_fmt(best['tolerance'], '.3g')})",
            f"- Clock state: {json.dumps(best['clock']) if best['clock'] else 'n/a (CPU)'}"]


def _stage_lines(report: dict[str, Any]) -> list[str]:
    """The median wall time of each stage of an evaluation (report.json lists every one)."""
    median = report.get("stages_median") or {}
    if not median:
        return []
    return ["## Time per evaluation", "",
            f"Median wall seconds per stage over {len(report['stages'])} evaluations:", "",
            "| " + " | ".join(name.replace("_", " ") for name in median) + " |",
            "|" + "---|" * len(median),
            "| " + " | ".join(f"{v:.3g}" for v in median.values()) + " |", ""]


def write_results(store: Store, home: Home, job_id: int) -> Path | None:
    """(Re)write ``results/NAME/`` for a job; returns the folder, or None when a newer job of
    the same problem owns it."""
    job = store.job(job_id)
    if job is None:
        return None
    folder = home.results / job["problem_name"]
    existing = folder / "report.json"
    if existing.exists():
        try:
            owner = json.loads(existing.read_text()).get("job", 0)
        except (OSError, ValueError):
            owner = 0
        if owner > job_id:
            return None
    candidates = store.candidates(job_id)
    report = build_report(job, candidates, screened_count(store.conn, job_id))
    folder.mkdir(parents=True, exist_ok=True)
    best = next((c for c in candidates if c["id"] == job["best_candidate_id"]), None)
    if best is not None:
        atomic_write(folder / "best.py", best["source"])
    else:
        (folder / "best.py").unlink(missing_ok=True)   # an older revision's best is not this one's
    atomic_write(folder / "report.json", json.dumps(report, indent=2, default=str) + "\n")
    atomic_write(folder / "report.md", render_markdown(report))
    return folder
