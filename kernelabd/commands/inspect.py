"""``kernelab inspect REFERENCE``: what a job would use, before any candidate exists.

The reference runs in its sandbox exactly as a job's would: the memory plan first, then every
input set with its float64 oracle, then the capture. The report is what a user wants to know
about a new file: shapes and dtypes, FLOPs and minimum bytes, the speed-of-light floor on this
device, the library kernels eager PyTorch launches, the memory plan, and the peak host and
device memory each kernelab process reached. A problem that cannot fit is refused here, with
its memory reason, exactly as a job would refuse it.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import click

from kernelabd.client import ensure_home, home_option
from kernelabd.harness.problem import one_line
from store.home import resolve_home

GiB = 1 << 30


@click.command()
@home_option
@click.argument("reference", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--device", default=None, help="cpu | cuda | cuda:N (default: a GPU if any).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def inspect(home_dir: str | None, reference: Path, device: str | None, as_json: bool) -> None:
    """Run REFERENCE once with its float64 oracle and report what a job would use."""
    from kernelabd.commands.port import pick_device
    from kernelabd.config import ConfigError, load

    home = ensure_home(resolve_home(home_dir))
    try:
        config = load(home.config)
    except ConfigError as exc:
        click.echo(f"kernelab inspect: {exc}", err=True)
        sys.exit(2)
    report = run_inspect(reference, pick_device(device), config, home)
    if as_json:
        click.echo(json.dumps(report))
    else:
        click.echo(describe(report))
    sys.exit(0 if report["outcome"] == "ok" else 2)


def run_inspect(reference: Path, device: str, config: Any, home: Any) -> dict[str, Any]:
    """The inspection as one JSON-ready dict (``outcome`` ok | refused)."""
    from kernelabd.harness.check import normalise_device
    from kernelabd.harness.problem import ProblemError, load_problem
    from kernelabd.harness.sandbox import SandboxError
    from kernelabd.harness.session import Rejected, Session

    t0 = time.monotonic()
    out: dict[str, Any] = {"reference": str(reference), "device": device, "outcome": "ok", "reason": None}
    try:
        device = out["device"] = normalise_device(device)
        problem = load_problem(reference)
    except ProblemError as exc:
        return {**out, "outcome": "refused", "reason": str(exc), "wall_s": round(time.monotonic() - t0, 3)}
    with Session(problem, device, config) as session:
        try:
            session.open()
            capture = session.capture()
        except Rejected as rej:
            out.update(outcome="refused", reason=rej.result.reason, rule=rej.result.rule)
        except SandboxError as exc:
            out.update(outcome="refused", reason=f"{reference}: capture failed: {exc.message}", rule="bad_reference")
        else:
            out.update(shapes=shapes_of(session), capture=capture,
                       speed_of_light=floor(capture, device, config, home, problem.sidecar.tf32))
        out["plan"] = session.plan.to_json() if session.plan is not None else None
        out["memory"] = memory_of(session)
    out["wall_s"] = round(time.monotonic() - t0, 3)
    return out


def shapes_of(session: Any) -> list[dict[str, Any]]:
    """Each gate shape's constants, input and output dtypes and shapes (from its first set)."""
    from kernelabd.harness.session import gate_shapes

    found = []
    for idx, constants in enumerate(gate_shapes(session.problem.sidecar, session.device)):
        rs = next(s for s in session.ref.sets if s.shape == idx)
        found.append({"constants": constants,
                      "inputs": [{"dtype": s.dtype, "shape": s.shape} for s in rs.inputs],
                      "scalars": [v for v in rs.scalars if v is not None],
                      "outputs": [{"dtype": o["dtype"], "shape": o["shape"]} for o in rs.outputs]})
    return found


def memory_of(session: Any) -> dict[str, Any]:
    """Peak resident memory of this (trusted) process and of the reference's sandbox, the
    device memory the reference's own allocations peaked at, and what its shared arenas hold
    (input sets and oracles, outside the allocator's count)."""
    info = session.ref.info if session.ref is not None else {}
    return {"trusted_rss_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "reference_rss_peak_bytes": info.get("rss_peak_bytes"),
            "reference_device_peak_bytes": info.get("device_peak_bytes"),
            "reference_arena_bytes": info.get("arena_bytes")}


def floor(capture: dict[str, Any], device: str, config: Any, home: Any, tf32: bool) -> dict[str, Any] | None:
    """The speed-of-light floor from this home's ceilings for the device (measured once)."""
    from kernelabd.service import ceilings
    from store import search
    from store.db import connect

    conn = connect(home.db)
    try:
        ident = ceilings.identity(device, config.timing.lock_clocks)
        found = search.ceilings(conn, ident.key)
        if found is None:
            found = ceilings.measure(device)
            search.keep_ceilings(conn, ident.key, ident.name, found)
    except Exception as exc:  # out of memory on a busy GPU: no floor, and the report says why
        return {"error": one_line(exc)}
    finally:
        conn.close()
    return ceilings.floor_ms(capture, found, tf32=tf32)


def _gib(n: Any) -> str:
    return f"{n / GiB:.2f} GiB" if isinstance(n, int | float) else "?"


def describe(report: dict[str, Any]) -> str:
    """The inspection for a terminal."""
    lines = [f"{report['reference']} on {report['device']}: {report['outcome']}"
             + (f" — {report['reason']}" if report.get("reason") else "")]
    for i, shape in enumerate(report.get("shapes", [])):
        ins = ", ".join(f"{t['dtype']}{t['shape']}" for t in shape["inputs"])
        outs = ", ".join(f"{t['dtype']}{t['shape']}" for t in shape["outputs"])
        lines.append(f"  shape {i} {shape['constants'] or '(as written)'}: inputs {ins} → outputs {outs}")
    cap = report.get("capture") or {}
    if cap:
        lines.append(f"  work: {cap.get('flops', 0):.4g} FLOPs, at least {_gib(cap.get('min_bytes'))} moved")
        for k in cap.get("launches", [])[:8]:
            lines.append(f"    launches {k['name'][:80]} ×{k['count']} ({k['device_us']:.1f} µs)")
    sol = report.get("speed_of_light") or {}
    if sol.get("ms"):
        lines.append(f"  speed of light: {sol['ms']:.4g} ms ({sol.get('bound')}-bound)")
    elif sol.get("error"):
        lines.append(f"  speed of light: not measured ({sol['error']})")
    plan = report.get("plan")
    if plan:
        lines.append(f"  memory plan: {plan['gate_sets']} gate set(s) {plan['variants']}, {plan['timing_sets']} "
                     f"timing set(s), oracle {plan['oracle']}; needs "
                     f"{_gib(plan['needs_device_bytes'] or plan['needs_host_bytes'])} of "
                     f"{_gib(plan['device_free_bytes'] or plan['host_total_bytes'])}"
                     + (f"; dropped {plan['dropped']}" if plan["dropped"] else ""))
    mem = report.get("memory") or {}
    lines.append(f"  peak memory: this process {_gib(mem.get('trusted_rss_peak_bytes'))}, reference sandbox "
                 f"{_gib(mem.get('reference_rss_peak_bytes'))} host / {_gib(mem.get('reference_device_peak_bytes'))} "
                 f"device; {report['wall_s']:.1f} s")
    return "\n".join(lines)
