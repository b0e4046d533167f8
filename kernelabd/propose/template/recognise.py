"""The recognition subprocess (``python -m kernelabd.propose.template.recognise``): the
reference loaded, traced and matched against the templates, in a process of its own under the
proposer's deadline (``kernelabd.propose.isolated``), so that a reference that hangs, crashes or
misbehaves at import or in forward costs a recorded decline, never the worker.

Request (JSON on stdin): ``source``, ``constants`` (the module constants of the job's device),
``target`` and ``tf32`` (from the sidecar), ``out`` (where to write the answer). Answer: either
``{"seed": MATCH, "exact": MATCH | null}`` (``exact``: the same template with IEEE dots, only
when the seed's are 3xTF32), each MATCH ``{"source", "edit", "dots"}``; or
``{"declined": reason, "unknown": [...], "kinds": [...]}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from kernelabd.harness.problem import Sidecar, one_line
from kernelabd.propose.isolated import write_phase
from kernelabd.propose.template.match import Match
from kernelabd.propose.template.proposer import TF32X3, Miss, match_graph, recognise_graph


def _as_json(found: Any) -> dict[str, Any] | None:
    return {"source": found.source, "edit": found.edit, "dots": found.dots} if isinstance(found, Match) else None


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """What the request asks, as the JSON answer (in this process: call it only here)."""
    sidecar = Sidecar(target=str(request.get("target", "triton")), tf32=bool(request.get("tf32", False)))
    source = request["source"]
    g = recognise_graph(source, request.get("constants") or {}, lambda p: write_phase(request, p))
    write_phase(request, "matching the graph against the templates")
    seed = g if isinstance(g, Miss) else match_graph(g, source, sidecar)
    if isinstance(seed, Miss):
        return {"declined": seed.reason, "unknown": seed.unknown, "kinds": seed.kinds}
    exact = match_graph(g, source, sidecar, exact=True, plan=seed.plan) if seed.dots == TF32X3 else None
    return {"seed": _as_json(seed), "exact": _as_json(exact)}


def _main() -> int:
    request = json.loads(sys.stdin.read())
    try:
        result = answer(request)
    except Exception as exc:   # the reference is arbitrary code; any failure is a decline
        result = {"declined": f"recognising the graph failed: {one_line(exc, 460)}", "unknown": [], "kinds": []}
    Path(request["out"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
